"""``research/chat_loss.py``: the workload's clients and turns, and one short replay."""

from __future__ import annotations

import pytest
from chat_loss import KVCacheManager, replay, report, workload


def test_clients_turns_and_ceilings_come_from_the_prompts() -> None:
    wl = workload(300)
    last: dict[int, tuple[int, ...]] = {}
    for i, r in enumerate(wl.requests):
        assert r.prompt is not None
        c = wl.client[i]
        if wl.turn[i] == 1:
            assert c not in last and wl.ceiling[i] == 0 and wl.gap[i] == 0
        else:
            prev = last[c]
            assert r.prompt[: len(prev)] == prev  # a turn extends its client's last prompt
            assert wl.ceiling[i] == len(prev) and wl.gap[i] > 0
        last[c] = r.prompt
        assert wl.last_index[c] >= i


def test_a_short_replay_records_every_hit_and_restores_the_manager(capsys) -> None:
    original = KVCacheManager.record_prefix_cache_stats
    wl = workload(200)
    run = replay("jamba-v0.1", 2, "hybrid", None, wl, every=50)
    assert KVCacheManager.record_prefix_cache_stats is original
    assert len(run.hits) == len(wl.requests) and len(run.returning) == len(wl.requests) - 1
    # Nothing is shared between clients: no hit passes the previous turn's prompt.
    assert all(h <= c for h, c in zip(run.hits, wl.ceiling, strict=True))
    assert sum(run.hits) > 0 and sum(run.census.values()) > 0
    assert run.rate == pytest.approx(sum(run.hits) / sum(r.input_length for r in wl.requests))
    report("hybrid", run, wl)
    assert "token hit rate" in capsys.readouterr().out


def test_the_losses_are_attributed_to_what_was_evicted(capsys) -> None:
    """``chat_loss_why``: every request gets an attribution, the lost tokens add
    up to the ceiling minus the hit, and a tight Scout budget evicts something."""
    wl = workload(300)
    run = replay("llama-4-scout", 8, "hybrid", None, wl, every=100)
    assert len(run.why.lost) == len(wl.requests)
    lost = [n for _, n in run.why.lost]
    assert lost == [max(0, c - h) for c, h in zip(wl.ceiling, run.hits, strict=True)]
    assert run.evictions is not None and sum(run.evictions.by_class.values()) > 0
    report("hybrid", run, wl)
    assert "lost tokens by the first missing block" in capsys.readouterr().out
