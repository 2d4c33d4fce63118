"""``PackedLinear``: bf16 linear layers on the CPU over a weight pre-packed for oneDNN.

``F.linear`` on a plain bf16 weight lets oneDNN re-block the weight on every
call; packing it once into oneDNN's own layout (what inductor's freezing pass
does) makes decode-sized products ~1.5-2x faster (the 262k-vocab LM head of
Gemma 3 270M: ~22 -> ~15 ms for 16 rows on 2 cores) with bit-identical results
(same kernel, same accumulation). fp32 is left alone: its packed path rounds
differently and is slower for large batches.

``pack_linears(model)`` swaps every eligible ``nn.Linear`` (CPU, bf16, oneDNN
bf16 support) for a ``PackedLinear`` that keeps the original ``weight``
Parameter (so tied weights, ``named_parameters`` and the loader see no change)
plus the packed copy: weights are held twice (the cost of the speed).
The packed copy is a snapshot: call ``pack_linears`` after loading weights.

``pack_linears(model, amx=True)`` (backends with ``amx_linears``: ``native``) also
packs each weight for the AMX kernel of ``hybridkv.kernels.cpu.amx`` where this
CPU has AMX-BF16 and ``in_features`` is a multiple of 32: products of at most
``AMX_MAX_ROWS`` rows (decode steps) run there, larger ones on oneDNN. On the
decode shapes of Gemma 3 270M that kernel is 1.1-1.4x faster than oneDNN's
(``benchmarks/results/engine.md``) and gives the same bits up to 16 rows; past
that oneDNN picks other kernels and the last bit of a few outputs can differ.
Such weights are held three times. ``PackedLinear.kernel_for(rows)`` says which
kernel a product of ``rows`` rows runs on.

Why this stays a module swapped at load, not a ``KernelBackend.linear`` op: the
packed copies are snapshots of loaded weights (made once, after loading); the
original ``weight`` must stay the Parameter that ties, loads and reports; and
every product would otherwise pay a dispatch hop on the hottest call. The
backend decides only whether AMX is used (``KernelBackend.amx_linears``, passed
to ``pack_linears`` by the loader) and says so in ``describe()``. The oneDNN
calls (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``)
are torch's private ops, the ones inductor's freezing pass emits; they are
confined to this module, and ``packing_supported`` checks oneDNN is there.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hybridkv.kernels.cpu import amx as amx_kernel

#: Largest number of rows a product runs on the AMX kernel (measured crossover
#: with oneDNN on 2 cores: AMX faster up to 64 rows, even from ~96).
AMX_MAX_ROWS = 64


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """True where ``pack_linears`` packs: CPU, bf16, oneDNN with bf16 support."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class PackedLinear(nn.Module):
    """``y = x @ weight.T + bias`` through oneDNN's pre-packed weight (see module doc)."""

    def __init__(self, linear: nn.Linear, amx: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
            use_amx = amx and amx_kernel.supports(self.weight) and amx_kernel.amx_available()
            self.amx_packed = amx_kernel.pack_weight(self.weight) if use_amx else None
            self.amx_bias = (
                self.bias.detach().float().contiguous()
                if use_amx and self.bias is not None
                else None
            )

    def kernel_for(self, rows: int) -> str:
        """``"amx"`` or ``"onednn"``: where a bf16 product of ``rows`` rows runs."""
        return "amx" if self.amx_packed is not None and rows <= AMX_MAX_ROWS else "onednn"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        if self.amx_packed is not None and x.dim() == 2 and self.kernel_for(x.shape[0]) == "amx":
            if x.stride(-1) != 1:
                x = x.contiguous()
            return amx_kernel.linear(x, self.amx_packed, self.out_features, self.amx_bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        kind = "packed, amx" if self.amx_packed is not None else "packed"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


def pack_linears(model: nn.Module, amx: bool = False) -> int:
    """Replace every CPU bf16 ``nn.Linear`` of ``model`` by a ``PackedLinear``; returns the count.

    Does nothing (returns 0) where ``packing_supported`` is false for a layer's weight.
    ``amx``: also pack for the AMX kernel where it runs (see the module docstring).
    """
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            w = getattr(child, "weight", None)
            if (
                type(child) is nn.Linear
                and isinstance(w, torch.Tensor)
                and packing_supported(w.device, w.dtype)
            ):
                setattr(parent, name, PackedLinear(child, amx=amx))
                count += 1
    return count


def describe_linears(model: nn.Module) -> str:
    """Which kernels ``model``'s linear layers run on, in one line (for reports)."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if not packed:
        return "torch F.linear"
    n_amx = sum(m.amx_packed is not None for m in packed)
    if n_amx == 0:
        return f"oneDNN packed ({len(packed)} layers)"
    return f"AMX up to {AMX_MAX_ROWS} rows, oneDNN above ({n_amx} of {len(packed)} layers on AMX)"
