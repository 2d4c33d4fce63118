"""Projections of one input as one GEMM: q, k, v as ``qkv_proj``, gate and up as ``gate_up_proj``.

Why: a decode step of a small model on a GPU is bound by its kernels' count, not their
bytes (issue 47: 289 kernels of a few microseconds each in a graphed Gemma 3 270M step
on an H100); three products of the same rows are three GEMM launches where one GEMM
over the stacked weights does the same work.

``MergeableProjections`` is a mixin for a module whose linear layers keep the
checkpoint's names (``q_proj`` ...), so that the strict loader fills them as usual.
After loading, ``merge_projections(model)`` (``load_model``, unless
``LLM(merge_projections=False)``) replaces each group named in ``MERGED`` by one
``nn.Linear`` whose weight (and bias) stacks the parts' in order, and drops the parts
(no copy is held twice; CPU bf16 linears are packed after the merge, as any other).
``project(x, name)`` returns the parts' outputs either way: before the merge one
product each, after it column views of the merged product (row stride: the merged
width; the kernels take row strides).

Who declares it: every family's attention (``GroupedQueryAttention``: Mistral /
Ministral, Command R7B, Jamba, Bamba, Granite 4.0 H; Gemma 3's; Llama 4's) and every
SwiGLU-style MLP (``SwiGLU``: the dense MLPs, Jamba's experts, Llama 4's dense MLP and
shared expert; Gemma 3's). Not merged, because nothing is left to stack: Granite 4.0
H's shared MLP (``input_linear`` is gate and up in one checkpoint tensor already) and
the routed experts stored stacked (Llama 4's ``experts.gate_up_proj``, Granite's).

Numerics: each output element is the same dot product, but a GEMM library picks its
kernel by shape, and a kernel may sum in another order. Measured on the CPU: fp32
products were bit-identical merged and apart (MKL, every row count 1-256 at Gemma 3
270M's shapes and the tiny test checkpoints'), as were oneDNN-packed bf16 products;
plain bf16 ``F.linear`` differed in one case (2 rows of the tiny test shape, by one
bf16 ulp). On a GPU cuBLAS may choose other kernels for the merged width, so bf16
outputs can part from the unmerged ones at near-ties: hence the switch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import nn


class MergeableProjections(nn.Module):
    """A module whose linear layers ``MERGED[name]`` can run as one ``name`` GEMM."""

    #: merged name -> the parts' names, in output order (same input, same bias or none).
    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: merged name -> the parts' output sizes, once merged.
    _splits: dict[str, tuple[int, ...]]

    def merge_projections(self) -> None:
        """Replace each group of ``MERGED`` by one ``nn.Linear`` (after loading)."""
        splits: dict[str, tuple[int, ...]] = {}
        for name, parts in self.MERGED.items():
            linears: list[nn.Linear] = []
            for p in parts:
                m = self.get_submodule(p)
                if type(m) is not nn.Linear:
                    raise TypeError(f"{type(self).__name__}.{p}: a part must be an nn.Linear")
                linears.append(m)
            first = linears[0]
            has_bias = first.bias is not None
            if any(
                m.in_features != first.in_features or (m.bias is not None) != has_bias
                for m in linears
            ):
                raise ValueError(f"{type(self).__name__}.{name}: parts differ in input or bias")
            sizes = tuple(m.out_features for m in linears)
            w = first.weight
            merged = nn.Linear(first.in_features, sum(sizes), bias=has_bias,
                               device=w.device, dtype=w.dtype)  # fmt: skip
            with torch.no_grad():
                merged.weight.copy_(torch.cat([m.weight for m in linears]))
                if has_bias:
                    merged.bias.copy_(torch.cat([m.bias for m in linears]))
            merged.requires_grad_(False)
            for p in parts:
                delattr(self, p)
            setattr(self, name, merged)
            splits[name] = sizes
        self._splits = splits

    def project(self, x: torch.Tensor, name: str) -> tuple[torch.Tensor, ...]:
        """The outputs of ``MERGED[name]``'s parts for ``x [T, in]``, merged or not."""
        sizes = getattr(self, "_splits", {}).get(name)
        if sizes is None:
            return tuple(self.get_submodule(p)(x) for p in self.MERGED[name])
        out: torch.Tensor = self.get_submodule(name)(x)
        return tuple(out.split(sizes, dim=-1))


def merge_projections(model: nn.Module) -> int:
    """``merge_projections()`` on every ``MergeableProjections`` of ``model``; returns
    how many GEMMs that removes per forward."""
    removed = 0
    for module in list(model.modules()):
        if isinstance(module, MergeableProjections):
            module.merge_projections()
            removed += sum(len(parts) - 1 for parts in module.MERGED.values())
    return removed
