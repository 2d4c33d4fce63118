"""The step-time model: closed-form attention sums, a hand-computed step, devices."""

from __future__ import annotations

import random

import pytest

from hybridkv.layouts import ModelLayout, shipped_layout
from hybridkv.sim.cost_model import CostModel, attended_pairs, tokens_read
from hybridkv.sim.devices import DEVICES, DeviceProfile, device_profile
from hybridkv.sim.model_params import ACTIVE_PARAMS, active_params_for

# A device with round numbers and no efficiency loss or overhead.
PLAIN = DeviceProfile(
    "plain",
    peak_flops=1e12,
    peak_bandwidth=1e9,
    compute_efficiency=1.0,
    bandwidth_efficiency=1.0,
    step_overhead_s=0.0,
)


def naive_keys(kind: str, span: int, p: int) -> int:
    """Keys the token at position p attends to, position by position."""
    keys = range(p + 1)
    if kind == "sliding_window":
        return sum(1 for k in keys if p - span < k)
    if kind == "chunked_local":
        return sum(1 for k in keys if k // span == p // span)
    return len(keys)


@pytest.mark.parametrize("kind", ["full", "sliding_window", "chunked_local"])
@pytest.mark.parametrize("span", [1, 3, 8])
def test_attended_pairs_match_a_position_by_position_count(kind, span):
    for start in range(0, 30):
        for end in range(start, 30):
            expected = sum(naive_keys(kind, span, p) for p in range(start, end))
            assert attended_pairs(kind, span, start, end) == expected, (start, end)


def test_tokens_read_per_kind():
    assert tokens_read("full", 0, 100, 101) == 101  # a decode reads the whole context
    assert tokens_read("sliding_window", 32, 100, 101) == 32  # W - 1 before + itself
    assert tokens_read("sliding_window", 32, 0, 100) == 100  # a prefill shorter than W + chunk
    assert tokens_read("sliding_window", 32, 200, 300) == 131  # 31 before + 100
    assert tokens_read("chunked_local", 64, 130, 131) == 3  # chunk 2 starts at 128
    assert tokens_read("chunked_local", 64, 100, 200) == 136  # from 64 (chunk of 100) to 200


def layout(text: str) -> ModelLayout:
    import yaml

    return ModelLayout.model_validate(yaml.safe_load(text))


FULL_AND_SLIDING = layout(
    """
name: hand
cache_dtype: bfloat16
max_model_len: 1024
layer_kinds:
  full: {kind: full, num_kv_heads: 2, head_dim: 64}
  swa: {kind: sliding_window, sliding_window: 32, num_kv_heads: 2, head_dim: 64}
layers: [full, swa]
"""
)


def test_a_hand_computed_step():
    # Chunks: a 100-token prefill [0, 100) and one decode at position 50 ([50, 51)).
    # width 2 * 64 = 128; K+V bytes per token 2 * 128 * 2 = 512.
    # FLOPs: weights 2 * 1e6 * 101 = 202,000,000
    #   full pairs 5050 + 51 = 5101          -> 4 * 128 * 5101 = 2,611,712
    #   sliding pairs (1+..+32) + 68 * 32 + 32 = 528 + 2176 + 32 = 2736
    #                                        -> 4 * 128 * 2736 = 1,400,832
    # bytes: weights 2 * 1e6 = 2,000,000
    #   full reads 100 + 51 = 151 tokens, sliding min(100, 31 + 100) + min(51, 31 + 1) = 132
    #   (151 + 132) * 512 = 144,896
    model = CostModel.from_layout(FULL_AND_SLIDING, PLAIN, active_params=1e6)
    step = model.step([(0, 100), (50, 51)])
    assert step.flops == 202_000_000 + 2_611_712 + 1_400_832
    assert step.bytes == 2_000_000 + 144_896
    assert step.seconds == pytest.approx(2_144_896 / 1e9)  # memory bound on PLAIN


def test_compute_bound_step_adds_the_overhead_and_uses_the_efficiencies():
    device = DeviceProfile("fast-memory", 1e12, 1e18, 0.5, 1.0, step_overhead_s=1e-3)
    model = CostModel.from_layout(FULL_AND_SLIDING, device, active_params=1e6)
    step = model.step([(0, 100), (50, 51)])
    assert step.seconds == pytest.approx(206_012_544 / 0.5e12 + 1e-3)
    assert model.step([]).seconds == 0.0


def test_mamba_layers_cost_their_scan_and_one_state_read_per_request():
    mamba = layout(
        """
name: hand-mamba
cache_dtype: bfloat16
max_model_len: 1024
layer_kinds:
  m: {kind: mamba1, d_state: 2, d_conv: 3, d_inner: 4}
layers: [m, m]
"""
    )
    # State: conv (2, 4) + SSM (4, 2) = 16 elements, 32 bytes in bf16; two layers.
    model = CostModel.from_layout(mamba, PLAIN, active_params=1e6)
    step = model.step([(0, 10), (7, 8)])  # 11 new tokens, 2 requests
    assert step.flops == 2e6 * 11 + 6 * 16 * 2 * 11
    assert step.bytes == 2e6 + 32 * 2 * 2


def test_device_profiles_and_unknown_device():
    h100 = device_profile("H100")
    assert (h100.peak_flops, h100.peak_bandwidth) == (989e12, 3.35e12)
    assert DEVICES["h200"].peak_bandwidth == 4.8e12
    assert DEVICES["a100"].peak_flops == 312e12
    with pytest.raises(ValueError, match="device must be one of h100, h200, a100, got 'b200'"):
        device_profile("b200")
    with pytest.raises(ValueError, match="compute_efficiency must be <= 1"):
        DeviceProfile("x", 1.0, 1.0, compute_efficiency=2.0)


def test_active_params_table_covers_the_real_shipped_layouts():
    for name in ACTIVE_PARAMS:
        shipped_layout(name)  # every entry names a shipped layout
    assert active_params_for("gemma-3-27b") == pytest.approx(27.016e9)
    assert active_params_for("jamba-v0.1") == 12e9
    assert active_params_for("toy-1full-3sliding", 5e8) == 5e8
    with pytest.raises(
        ValueError, match=r"no active parameter count for layout 'toy.*--active-params"
    ):
        active_params_for("toy-1full-3sliding")


def test_step_equals_the_per_chunk_definition_on_mixed_batches():
    chunked = layout(
        """
name: mixed
cache_dtype: bfloat16
max_model_len: 4096
layer_kinds:
  full: {kind: full, num_kv_heads: 2, head_dim: 64}
  swa: {kind: sliding_window, sliding_window: 32, num_kv_heads: 1, head_dim: 64}
  chunk: {kind: chunked_local, attention_chunk_size: 48, num_kv_heads: 4, head_dim: 32}
layers: [full, swa, swa, chunk]
"""
    )
    model = CostModel.from_layout(chunked, PLAIN, active_params=1e6)
    rng = random.Random(0)
    for _ in range(50):
        chunks = []
        for _ in range(rng.randint(1, 8)):
            start = rng.randint(0, 300)
            chunks.append((start, start + rng.choice([1, 1, 1, rng.randint(1, 200)])))
        flops = 2e6 * sum(e - s for s, e in chunks)
        read = 2e6
        for kind, span, width, n in [
            ("full", 0, 128, 1),
            ("sliding_window", 32, 64, 2),
            ("chunked_local", 48, 128, 1),
        ]:
            for s, e in chunks:
                flops += 4 * width * n * sum(naive_keys(kind, span, p) for p in range(s, e))
                read += 2 * width * 2 * n * tokens_read(kind, span, s, e)
        step = model.step(chunks)
        assert (step.flops, step.bytes) == (flops, read), chunks
