"""The cluster benchmark's workload: conversations whose turns share exactly the
prefixes their hash ids say, from the trace or generated (``benchmarks/cluster_workload.py``)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from cluster_workload import (  # noqa: E402
    as_text,
    generated_conversations,
    prefix_ceiling,
    trace_conversations,
)
from machine_info import VECTOR_UNITS, cpu_features  # noqa: E402


def _is_prefix(short: list[int], long: list[int]) -> bool:
    return long[: len(short)] == short and len(long) > len(short)


def test_generated_turns_extend_their_conversation_and_nothing_else() -> None:
    convs = generated_conversations(20, 3, 6, seed=1)
    assert len(convs) == 20 and all(3 <= len(c) <= 6 for c in convs)
    assert convs == generated_conversations(20, 3, 6, seed=1)  # the same every run
    owners: dict[int, int] = {}
    for k, conv in enumerate(convs):
        assert all(turn[0] == 0 for turn in conv)  # the block every prompt shares
        for a, b in itertools.pairwise(conv):
            assert _is_prefix(a, b) and len(b) - len(a) in (1, 2, 3)
        for h in conv[-1][1:]:
            assert owners.setdefault(h, k) == k  # no other conversation has this block


def test_text_prefixes_follow_the_blocks(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [[0, 1, 2], [0, 5], [0, 1, 2, 3], [0, 5, 6], [0, 1, 2, 3, 4], [0, 9]]
    trace.write_text("".join(json.dumps({"hash_ids": r}) + "\n" for r in rows))
    convs = trace_conversations(trace, n=5, min_turns=2, max_turns=5, max_blocks=10)
    assert convs == [[[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]], [[0, 5], [0, 5, 6]]]
    text = as_text(convs, words=3)
    first, second = text[0][0].split(), text[0][1].split()
    assert len(first) == 9 and second[:9] == first and len(second) == 12
    assert text[1][0].split()[:3] == first[:3]  # block 0, the same words
    assert text[1][0].split()[3:] != first[3:6]


def test_the_ceiling_counts_each_turn_s_longest_shared_prefix() -> None:
    """Turn [0, 1, 2] shares [0, 1] with its conversation's earlier turn; [0, 1] and
    [0, 3] share block 0 with each other; [0, 1, 2, 4] shares 3 blocks; nothing
    shares a later turn of its own conversation."""
    convs = [[[0, 1], [0, 1, 2], [0, 1, 2, 4]], [[0, 3]], [[5, 6]]]
    assert prefix_ceiling(convs) == (1 + 2 + 3 + 1 + 0) / (2 + 3 + 4 + 2 + 2)
    assert prefix_ceiling([[[7, 8]]]) == 0.0  # alone: nothing shared
    assert prefix_ceiling([]) == 0.0


def test_cpu_features_name_what_there_is_and_is_not() -> None:
    got = cpu_features()
    assert got == "CPU features unknown" or all(name in got for name in VECTOR_UNITS.values())
