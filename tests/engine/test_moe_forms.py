"""The routed experts' two forms (``models/layers/moe.py``): the dense form of graphed
steps gives the gathered form's output and reads nothing back from the device, for
Llama 4's, Jamba's and Granite 4.0 H's experts; the gathered form does read (``nonzero``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from host_reads import HOST_READS, RecordOps
from tiny_checkpoints import granite_config, jamba_config, llama4_config

from hybridkv.models.granite_moe import GraniteMoE
from hybridkv.models.jamba_moe import JambaSparseMoe
from hybridkv.models.layers.moe import RoutedExperts
from hybridkv.models.llama4_moe import Llama4MoE

#: name -> (MoE class, its config).
MAKERS: dict[str, tuple[Callable[[Any], RoutedExperts], Callable[[], Any]]] = {
    "llama4 (3 experts, top 2)": (
        Llama4MoE,
        lambda: llama4_config(num_local_experts=3, num_experts_per_tok=2),
    ),
    "llama4 (2 experts, top 1)": (Llama4MoE, llama4_config),
    "jamba": (JambaSparseMoe, lambda: jamba_config(num_experts=4, num_experts_per_tok=2)),
    "granite": (GraniteMoE, granite_config),
}


def _moe(name: str, rows: int) -> tuple[RoutedExperts, torch.Tensor]:
    """The MoE with random weights, and ``rows`` random inputs."""
    cls, make_config = MAKERS[name]
    config = make_config()
    torch.manual_seed(0)
    moe = cls(config)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return moe, torch.randn(rows, config.hidden_size)


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("rows", [1, 5, 37])
def test_the_dense_form_gives_the_gathered_output(name: str, rows: int) -> None:
    moe, x = _moe(name, rows)
    with torch.no_grad():
        gathered, dense = moe(x), moe(x, dense=True)
    # The same sums in the same order; only the matmuls see other row counts (fp32
    # rounding, the tolerance of test_llama4_layers.py's comparison with transformers).
    torch.testing.assert_close(dense, gathered, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MAKERS))
def test_only_the_gathered_form_reads_back_from_the_device(name: str) -> None:
    moe, x = _moe(name, 6)
    with torch.no_grad():
        with RecordOps() as dense:
            moe(x, dense=True)
        with RecordOps() as gathered:
            moe(x)
    assert not HOST_READS & set(dense.ops)
    assert "aten.nonzero.default" in gathered.ops
