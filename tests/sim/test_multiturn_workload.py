"""``benchmarks/multiturn.py``: the ablation's chat workload is deterministic, each
request continues one client's own conversation, clients share nothing, and no length
is quantized (the shape the ablation needs apart from Mooncake's 512-token units)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from multiturn import multiturn


def test_multiturn_is_seeded_and_each_turn_extends_its_client() -> None:
    reqs = multiturn(clients=40, requests=300, seed=3, active=8)
    assert [r.prompt for r in reqs] == [r.prompt for r in multiturn(40, 300, 3, active=8)]
    assert [r.prompt for r in reqs] != [r.prompt for r in multiturn(40, 300, 4, active=8)]
    assert len(reqs) == 300 and [r.line for r in reqs] == list(range(1, 301))
    assert all(r.output_length == 1 and r.input_length == len(r.prompt or ()) for r in reqs)
    # Each prompt either opens a conversation (its first 16 tokens are new) or is an
    # earlier prompt plus a turn: find the longest earlier prompt it extends.
    seen: dict[tuple[int, ...], tuple[int, ...]] = {}
    opened = 0
    for r in reqs:
        prompt = r.prompt
        assert prompt is not None
        head = prompt[:16]
        before = seen.get(head)
        if before is None:
            opened += 1
        else:
            assert len(prompt) > len(before) and prompt[: len(before)] == before
        seen[head] = prompt
    assert opened <= 40 and opened >= 8  # at most the clients, at least the first wave
    ends = {len(r.prompt or ()) % 512 for r in reqs}
    assert len(ends) > 100, "prompt lengths must not fall on a 512-token grid"


def test_multiturn_stops_when_every_client_is_done_and_checks_its_sizes() -> None:
    reqs = multiturn(clients=3, requests=1000, seed=0, active=2, rounds=2)
    assert 3 <= len(reqs) <= 9  # 1-3 turns per client
    with pytest.raises(ValueError, match="must be >= 1"):
        multiturn(clients=0)
    with pytest.raises(ValueError, match="medians and max_tokens"):
        multiturn(first_median=0)
