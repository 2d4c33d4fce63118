"""The reuse horizon (``HybridTuning.learn_reuse_horizon``) must pay on the chat
workload where the value ranking alone loses to recency.

``benchmarks/multiturn.py`` (seed 0, the first 1,000 requests: 64 clients at a
time, nothing shared between them) on Llama 4 Scout at 64 GB, replayed as
``hybridkv simulate`` does. With the chunked value weight, the full-attention
blocks of clients that have left stay in the top value class while live
clients' blocks go; the horizon drops the bonus of blocks released longer ago
than every recent return. Measured (2026-11-28): 74.35 % off, 76.58 % on; the
test asks for 1 point. Broken on purpose (no gaps fed to the free set, or the
bonus never dropped), on equals off and the test fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridkv.layouts import shipped_layout
from hybridkv.sim import CostModel, SimOptions, active_params_for, device_profile, replay_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from multiturn import multiturn


def hit_rate(tuning: str | None) -> float:
    layout = shipped_layout("llama-4-scout")
    requests = multiturn(requests=1000, seed=0)
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params_for(layout.name))
    options = SimOptions(
        memory_bytes=64 * 10**9,
        policy="hybrid",
        max_num_seqs=1,
        arrivals="closed",
        tuning=tuning,
        max_model_len=max(r.num_tokens for r in requests),
    )
    return replay_trace(layout, requests, options, cost).token_hit_rate


def test_reuse_horizon_gains_on_the_chat_workload() -> None:
    off = hit_rate("learn_reuse_horizon=off")
    on = hit_rate(None)
    assert on - off >= 0.01, f"reuse horizon on {on:.4f}, off {off:.4f}"
