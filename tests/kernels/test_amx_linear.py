"""The AMX linear kernel (``hybridkv.kernels.cpu.amx``) and its use by ``PackedLinear``.

Checked against an fp64 product: each output is one fp32 chain over ``k`` then
a bf16 rounding, so it is within one bf16 ulp plus the fp32 chain's error
bound (``k * 2^-23 * sum |x w|``) of the exact value. The kernel's own
contracts are checked bit for bit: a row's result does not depend on the other
rows, and a product over concatenated weights equals the separate products.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.kernels.cpu import NativeBuildError, amx
from hybridkv.models.layers import packed_linear
from hybridkv.models.layers.packed_linear import (
    AMX_MAX_ROWS,
    PackedLinear,
    describe_linears,
    packing_supported,
)

needs_amx = pytest.mark.skipif(
    not amx.amx_available(), reason=f"AMX kernel unavailable: {amx.amx_status()}"
)


def _bf16(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def _assert_within_bound(
    y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
) -> None:
    exact = x.double() @ w.double().T
    mag = x.double().abs() @ w.double().abs().T
    if bias is not None:
        exact = exact + bias.double()
        mag = mag + bias.double().abs()
    k = x.shape[1]
    ulp = exact.abs().clamp_min(2.0**-126) * 2.0**-7  # one bf16 ulp (8-bit significand)
    bound = ulp + (k + 1) * 2.0**-23 * mag
    assert y.dtype == torch.bfloat16 and y.shape == exact.shape
    assert ((y.double() - exact).abs() <= bound).all(), (y.double() - exact).abs().max()


@needs_amx
@pytest.mark.parametrize("m", [1, 5, 16, 17, 40, 64, 100])
@pytest.mark.parametrize(("n", "k"), [(16, 32), (64, 96), (100, 640), (1000, 64), (640, 2048)])
def test_matches_the_exact_product_within_rounding(m: int, n: int, k: int) -> None:
    x, w = _bf16(m, k, seed=m), _bf16(n, k, scale=0.05, seed=n + k)
    _assert_within_bound(amx.linear(x, amx.pack_weight(w), n), x, w)


@needs_amx
def test_bias_is_added_in_fp32_before_rounding() -> None:
    x, w = _bf16(7, 96), _bf16(130, 96, scale=0.05, seed=1)
    bias = torch.randn(130, generator=torch.Generator().manual_seed(2))
    _assert_within_bound(amx.linear(x, amx.pack_weight(w), 130, bias), x, w, bias)


@needs_amx
def test_rows_and_column_groups_are_independent_bit_for_bit() -> None:
    x = _bf16(33, 640)
    q, k, v = (_bf16(n, 640, scale=0.05, seed=n) for n in (1024, 256, 200))
    fused = amx.linear(x, amx.pack_weight(torch.cat([q, k, v])), 1480)
    apart = [amx.linear(x, amx.pack_weight(t), t.shape[0]) for t in (q, k, v)]
    assert torch.equal(fused, torch.cat(apart, dim=1))
    one_row = amx.linear(x[20:21], amx.pack_weight(q), 1024)
    assert torch.equal(one_row, apart[0][20:21])


@needs_amx
def test_strided_rows_and_specials() -> None:
    wide = _bf16(9, 200)
    x = wide[:, 8:168]  # row stride 200, k = 160
    w = _bf16(70, 160, scale=0.05, seed=3)
    w[5] = 0.0
    y = amx.linear(x, amx.pack_weight(w), 70)
    _assert_within_bound(y, x.contiguous(), w)
    assert (y[:, 5] == 0).all()
    x_inf = x.clone()
    x_inf[0, 0] = float("inf")
    y_inf = amx.linear(x_inf, amx.pack_weight(w), 70)
    assert torch.isinf(y_inf[0][w[:, 0] != 0]).all() and torch.equal(y_inf[1:], y[1:])


@needs_amx
def test_bad_inputs_are_refused() -> None:
    w = _bf16(64, 96)
    packed = amx.pack_weight(w)
    with pytest.raises(ValueError, match="in % 32"):
        amx.pack_weight(_bf16(64, 100))
    with pytest.raises(ValueError, match="in % 32"):
        amx.pack_weight(w.float())
    with pytest.raises(ValueError, match="does not match"):
        amx.linear(_bf16(2, 96), packed, 128)
    with pytest.raises(ValueError, match="dtype"):
        amx.linear(_bf16(2, 96).float(), packed, 64)
    with pytest.raises(ValueError, match="bias"):
        amx.linear(_bf16(2, 96), packed, 64, torch.zeros(64, dtype=torch.bfloat16))
    assert amx.linear(_bf16(0, 96), packed, 64).shape == (0, 64)


@pytest.mark.parametrize(
    ("code", "why"),
    [(1, None), (0, "no AMX-BF16"), (2, "without AMX code"), (-1, "refused the AMX tile state")],
)
def test_status_says_why_amx_cannot_run(
    monkeypatch: pytest.MonkeyPatch, code: int, why: str | None
) -> None:
    monkeypatch.setattr(amx, "library", lambda: SimpleNamespace(hkv_amx_init=lambda: code))
    status = amx.amx_status.__wrapped__()
    assert status is None if why is None else why in status


def test_status_reports_a_failed_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise NativeBuildError("no compiler here\nmore detail")

    monkeypatch.setattr(amx, "library", broken)
    assert amx.amx_status.__wrapped__() == "no compiler here"


@needs_amx
def test_packed_linear_runs_small_batches_on_amx() -> None:
    lin = nn.Linear(96, 130, bias=True).to(torch.bfloat16)
    packed = PackedLinear(lin, amx=True)
    assert packed.kernel_for(1) == "amx" and packed.kernel_for(AMX_MAX_ROWS) == "amx"
    assert packed.kernel_for(AMX_MAX_ROWS + 1) == "onednn"
    assert "amx" in repr(packed)
    for rows in (3, AMX_MAX_ROWS):
        x = _bf16(rows, 96, seed=rows)
        _assert_within_bound(packed(x), x, lin.weight.detach(), lin.bias.detach().float())
    x = _bf16(AMX_MAX_ROWS + 1, 96)
    assert torch.equal(packed(x), F.linear(x, lin.weight, lin.bias))  # oneDNN above
    model = nn.Sequential(packed, nn.Linear(130, 7).to(torch.bfloat16))
    assert describe_linears(model).startswith("AMX up to 64 rows")


@pytest.mark.skipif(
    not packing_supported(torch.device("cpu"), torch.bfloat16),
    reason="oneDNN bf16 not available on this CPU",
)
def test_packed_linear_without_amx_stays_on_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed_linear.amx_kernel, "amx_available", lambda: False)
    lin = nn.Linear(96, 130).to(torch.bfloat16)
    packed = PackedLinear(lin, amx=True)
    assert packed.amx_packed is None and packed.kernel_for(1) == "onednn"
    odd = PackedLinear(nn.Linear(24, 40).to(torch.bfloat16), amx=True)  # in % 32 != 0
    assert odd.amx_packed is None
    assert describe_linears(nn.Sequential(packed, odd)) == "oneDNN packed (2 layers)"
    assert describe_linears(nn.Linear(3, 4)) == "torch F.linear"
