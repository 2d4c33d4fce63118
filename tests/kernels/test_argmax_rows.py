"""Greedy sampling's native argmax: ``logits.max(-1).indices`` without an fp32 copy."""

from __future__ import annotations

import pytest
import torch

from hybridkv.kernels.cpu import argmax_rows, native_status

pytestmark = pytest.mark.skipif(
    native_status() is not None, reason=f"native CPU kernels unavailable: {native_status()}"
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 17), (16, 70000), (40, 1000)])
def test_matches_torch_max_indices(dtype: torch.dtype, rows: int, cols: int) -> None:
    g = torch.Generator().manual_seed(rows * cols)
    logits = (torch.randn(rows, cols, generator=g) * 4).to(dtype)
    # bf16 has many exact ties: the first maximal index must win, as in torch.
    assert torch.equal(argmax_rows(logits), logits.max(-1).indices)
    assert torch.equal(argmax_rows(logits), logits.float().max(-1).indices)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ties_signed_zeros_infinities_and_nan(dtype: torch.dtype) -> None:
    logits = torch.full((5, 9), -1.0, dtype=dtype)
    logits[0, [2, 6]] = 3.0  # tie: first wins
    logits[1] = -0.0
    logits[1, 4] = 0.0  # -0 == +0: index 0 wins, as in torch
    logits[2, 7] = float("inf")
    logits[3] = float("-inf")
    logits[4, 3] = 5.0
    logits[4, [5, 8]] = float("nan")  # NaN wins, first one
    assert argmax_rows(logits).tolist() == [2, 0, 7, 0, 5]
    assert torch.equal(argmax_rows(logits), logits.max(-1).indices)


def test_strided_rows_and_bad_inputs() -> None:
    wide = torch.randn(6, 300).to(torch.bfloat16)
    view = wide[:, 10:250]
    assert torch.equal(argmax_rows(view), view.max(-1).indices)
    assert argmax_rows(torch.empty(0, 5)).shape == (0,)
    with pytest.raises(ValueError, match="empty"):
        argmax_rows(torch.empty(3, 0))
    with pytest.raises(ValueError, match="bf16 or fp32"):
        argmax_rows(torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="dims"):
        argmax_rows(torch.zeros(3))
