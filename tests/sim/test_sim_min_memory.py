"""The replay at the planner's minimum memory: a lone request never preempts itself.

The replay drives the engine's scheduler and manager, so ``hybrid``'s rule for a
lone request whose step does not fit (``hybridkv.policy.shedding.alone_plan``:
it gives up its kept points and its tail) holds here too. Before it, the
request preempted itself and was admitted again at the next step (the replay
retries such a step; the engine stopped with "no request can be scheduled").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridkv.layouts import load_layout
from hybridkv.planning.planner import plan_pages
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace

#: Gemma 3's pattern, tiny: three sliding-window layers (window 7) per full one.
TINY_GEMMA_YAML = """\
name: tiny-gemma
cache_dtype: float16
max_model_len: 4096
layer_kinds:
  s: {kind: sliding_window, sliding_window: 7, num_kv_heads: 1, head_dim: 8}
  f: {kind: full, num_kv_heads: 1, head_dim: 8}
pattern: [s, s, s, f]
num_layers: 4
"""


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
@pytest.mark.parametrize(("count", "max_model_len"), [(1, 96), (6, 48)])
def test_replay_at_the_minimum(tmp_path: Path, policy: str, count: int, max_model_len: int) -> None:
    layout_path = tmp_path / "tiny-gemma.yaml"
    layout_path.write_text(TINY_GEMMA_YAML, encoding="utf-8")
    layout = load_layout(layout_path)
    rows = [
        {"prompt_token_ids": list(range(1000 * i, 1000 * i + 40 - 4 * i)), "output_length": 8}
        for i in range(count)
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pages = plan_pages(layout, block_size=4, max_model_len=max_model_len, max_num_batched_tokens=8)
    options = SimOptions(
        memory_bytes=pages.min_memory_bytes,
        policy=policy,
        block_size=4,
        max_num_batched_tokens=8,
        max_model_len=max_model_len,
        arrivals="closed",
    )
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params=1e9)
    r = replay_trace(layout, load_trace(trace), options, cost)
    assert r.output_tokens == 8 * count
    if count == 1:
        assert r.preemptions == 0  # hybrid preempted its lone request once
