"""``RopeTable`` (``models/layers/rope_table.py``): a step's RoPE cos/sin gathered from a
table of every position is bit-identical to computing it at the step's positions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybridkv.kernels.torch_backend import TorchBackend
from hybridkv.models.batch import ForwardBatch
from hybridkv.models.layers.rope_table import MAX_TABLE_BYTES, RopeTable, table_fits
from hybridkv.models.layers.rotary import RotaryEmbedding, attach_rope_tables
from hybridkv.models.llama4 import InterleavedRotary

MAX_POSITIONS = 4099  # odd, so the table's length is no multiple of a vector width
LOCAL, GLOBAL = {"rope_theta": 10_000.0}, {"rope_theta": 1_000_000.0}  # Gemma 3's bases


def _positions(seed: int) -> torch.Tensor:
    """Positions spanning the table: both ends, and random ones in between."""
    rand = torch.randint(0, MAX_POSITIONS, (61,), generator=torch.Generator().manual_seed(seed))
    return torch.cat((torch.tensor([0, 1, MAX_POSITIONS - 1]), rand))


def _batch(positions: torch.Tensor, *, graphed: bool = False) -> ForwardBatch:
    t = positions.shape[0]
    return ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64),
        positions=positions,
        query_starts_cpu=(0, t),
        logits_indices=torch.tensor([t - 1]),
        ops=TorchBackend(),
        graphed=graphed,
    )


@pytest.mark.parametrize("params", [LOCAL, GLOBAL], ids=["base1e4", "base1e6"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [256, 72])
def test_gathered_cos_sin_equal_the_computed_ones(params, dtype, head_dim):
    rotary = RotaryEmbedding(head_dim, params)
    table = RopeTable(MAX_POSITIONS)
    for seed in range(3):
        positions = _positions(seed)
        cos, sin = table.gather(positions, rotary.cos_sin, dtype, check=True)
        want_cos, want_sin = rotary.cos_sin(positions, dtype)
        assert cos.dtype == dtype and cos.shape == want_cos.shape == (64, 1, head_dim)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    # one table per dtype: [positions, (cos, sin), 1, head_dim]
    assert table.nbytes() == 2 * MAX_POSITIONS * head_dim * dtype.itemsize
    table.check_integrity()


@pytest.mark.parametrize("params", [LOCAL, GLOBAL], ids=["base1e4", "base1e6"])
def test_the_interleaved_form_gathers_equal_fp32_rows(params):
    rotary = InterleavedRotary(128, params)
    table = RopeTable(MAX_POSITIONS)
    positions = _positions(7)
    cos, sin = table.gather(positions, rotary.cos_sin, check=True)
    want_cos, want_sin = rotary.cos_sin(positions)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


def test_a_position_past_the_table_is_a_clear_error():
    rotary = RotaryEmbedding(64, LOCAL)
    table = RopeTable(16)
    with pytest.raises(ValueError, match=r"position 16 is past the RoPE table.*max_model_len"):
        table.gather(torch.tensor([3, 16]), rotary.cos_sin, torch.float32, check=True)
    with pytest.raises(ValueError, match="max_positions"):
        RopeTable(0)


class _TwoBases(nn.Module):
    """Gemma 3's layout: layers with a local base and layers with a global one."""

    def __init__(self) -> None:
        super().__init__()
        self.rotary = nn.ModuleList(
            RotaryEmbedding(64, LOCAL if i % 3 else GLOBAL) for i in range(6)
        )


def test_layers_of_one_base_share_a_table_and_a_step_gathers_once_per_base():
    model = _TwoBases()
    positions = _positions(3)
    untabled = _batch(positions)
    want = [r.for_step(untabled, torch.bfloat16) for r in model.rotary]
    tables = attach_rope_tables(model, MAX_POSITIONS)
    assert len(tables) == 2
    assert model.rotary[1].table is model.rotary[2].table is not model.rotary[0].table
    batch = _batch(positions, graphed=True)
    got = [r.for_step(batch, torch.bfloat16) for r in model.rotary]
    assert len(batch.step.rope) == 2
    assert got[1] is got[2]  # the step computed (gathered) each base once
    for (cos, sin), (want_cos, want_sin) in zip(got, want, strict=True):
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    with pytest.raises(ValueError, match="past the RoPE table"):
        model.rotary[0].for_step(_batch(torch.tensor([MAX_POSITIONS])), torch.bfloat16)


def test_a_table_that_would_pass_the_memory_bound_is_not_attached():
    fits = MAX_TABLE_BYTES // (2 * 64 * 4)  # positions of a 64-wide fp32 table at the bound
    assert table_fits(fits, 64) and not table_fits(fits + 1, 64)
    model = _TwoBases()
    assert attach_rope_tables(model, fits + 1) == {}
    assert all(r.table is None for r in model.rotary)
    positions = _positions(5)
    cos, _ = model.rotary[0].for_step(_batch(positions), torch.float32)
    assert torch.equal(cos, model.rotary[0].cos_sin(positions, torch.float32)[0])
