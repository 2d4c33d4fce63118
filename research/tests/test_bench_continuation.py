"""``research/bench_continuation.py``: conversations, turns and AUC on
hand-worked examples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bench_continuation import auc, conversations, report


def req(t: int, hash_ids: list[int], length: int) -> dict:
    return {"timestamp": t, "input_length": length, "output_length": 10, "hash_ids": hash_ids}


def test_next_turns_share_all_but_the_last_partial_block() -> None:
    reqs = [
        req(0, [0, 1, 2], 1300),  # a first turn
        req(1, [0, 7], 700),  # shares only the common first block: not a turn of 0
        req(5, [0, 1, 3, 4], 1800),  # re-renders block 2: continues 0, turn 1
        req(9, [0, 1, 3, 4, 5], 2400),  # shares all of 2: continues it, turn 2
        req(9, [0, 7, 8], 1200),  # continues 1
    ]
    parent, shared, continued, turn = conversations(reqs)
    assert parent == [-1, 0, 0, 2, 1]
    assert shared == [0, 1, 2, 4, 2]
    assert continued == [True, True, True, False, False]
    assert turn == [0, 0, 1, 2, 1]


def test_auc_ranks_positives_over_negatives_and_halves_ties() -> None:
    y = np.array([0, 0, 1, 1])
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), y) == 0.0
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), y) == 0.5
    assert auc(np.array([0.1, 0.5, 0.5, 0.9]), y) == 0.875  # one tie of four pairs
    with pytest.raises(ValueError, match="both"):
        auc(np.array([0.1, 0.2]), np.array([1, 1]))


def test_report_runs_on_a_small_trace(tmp_path: Path) -> None:
    rows = []
    for c in range(40):  # conversations of 1-4 turns, 10 s apart
        base = 1000 * c
        ids = [0, base + 1]
        for t in range(1 + c % 4):
            ids = [*ids[:-1], base + 10 * t + 2, base + 10 * t + 3]
            rows.append(req(60_000 * c + 10_000 * t, ids, 512 * len(ids) - 100))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    text = "\n".join(report(trace, 10_000))
    assert f"({len(rows):,} requests)" in text
    assert "AUC **" in text and "median 10," in text
