"""``PackedLinear``: bf16 CPU linears on oneDNN-packed weights give F.linear's exact bits."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.models.layers.packed_linear import PackedLinear, pack_linears, packing_supported

needs_packing = pytest.mark.skipif(
    not packing_supported(torch.device("cpu"), torch.bfloat16),
    reason="oneDNN bf16 not available on this CPU",
)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.proj = nn.Linear(24, 40, bias=True)
        self.head = nn.Linear(24, 50, bias=False)
        self.head.weight = self.embed.weight


@needs_packing
@pytest.mark.parametrize("rows", [1, 3, 16, 300])
def test_packed_matches_f_linear_bitwise(rows: int) -> None:
    torch.manual_seed(rows)
    lin = nn.Linear(96, 130, bias=rows % 2 == 1).to(torch.bfloat16)
    packed = PackedLinear(lin)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    assert torch.equal(packed(x), F.linear(x, lin.weight, lin.bias))
    x3 = torch.randn(2, rows, 96, dtype=torch.bfloat16)
    assert torch.equal(packed(x3), F.linear(x3, lin.weight, lin.bias))


@needs_packing
def test_pack_linears_keeps_parameters_and_ties() -> None:
    model = _Tied().to(torch.bfloat16)
    before = dict(model.named_parameters())
    assert pack_linears(model) == 2
    assert isinstance(model.proj, PackedLinear) and isinstance(model.head, PackedLinear)
    assert model.head.weight is model.embed.weight  # the tie survives
    assert dict(model.named_parameters()).keys() == before.keys()
    x = torch.randn(5, 24, dtype=torch.bfloat16)
    assert torch.equal(model.head(x), F.linear(x, model.embed.weight))


def test_fp32_and_non_cpu_are_left_alone() -> None:
    model = _Tied()
    assert pack_linears(model) == 0
    assert type(model.proj) is nn.Linear
    assert not packing_supported(torch.device("cpu"), torch.float32)
    assert not packing_supported(torch.device("meta"), torch.bfloat16)
