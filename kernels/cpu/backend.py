"""``native``: the C kernels of this package for the engine's CPU steps.

Cache write, decode attention read in place from the paged cache, the fused
Gemma residual norms, q/k norm + RoPE, GeGLU and greedy argmax run in C
(``ops.py``); linear layers also get the AMX decode kernel where the CPU has
it (``amx.py``, through ``PackedLinear``). Declared fallbacks to the torch
reference: Llama's ``rms_norm``, Llama 4's interleaved RoPE and the Mamba ops
(no C kernel; ``fallbacks``) and, inside
``attention``, the prefill rows (matmul-bound: torch's batched SDPA is as fast
as C would be; ``attention/native.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from hybridkv.kernels import qk_norm_rope_cache
from hybridkv.kernels.cpu.ops import add_norm_, argmax_rows, geglu, norm_rope_
from hybridkv.kernels.registry import KernelBackend
from hybridkv.kernels.torch_backend import TorchBackend


class NativeBackend(KernelBackend):
    """C kernels on the CPU; Llama norm and RoPE, Mamba ops, prefill attention rows: torch."""

    name = "native"
    kernels: ClassVar[Mapping[str, str]] = {
        "attention": "C: decode rows in place from the pages; prefill rows: torch SDPA (declared)",
        "cache_write": "C: hkv_cache_write, one memcpy per token row",
        "add_rms_norm": "C: hkv_add_norm, residual add fused with both norms, x updated in place",
        "norm_rope": "C: hkv_norm_rope, per-head norm + RoPE in place",
        "qk_norm_rope_cache": "C: hkv_norm_rope of q, of k, then hkv_cache_write (composed)",
        "gelu_tanh_mul": "C: hkv_geglu",
        "greedy": "C: hkv_argmax_rows, no fp32 copy of bf16 logits",
    }
    fallbacks: ClassVar[Mapping[str, type[KernelBackend]]] = {
        "rms_norm": TorchBackend,
        "rope_pairwise": TorchBackend,
        "causal_conv1d": TorchBackend,
        "selective_scan": TorchBackend,
        "ssd_scan": TorchBackend,
    }
    amx_linears = True
    linear_kernels = "AMX tiles up to 64 rows where the CPU has AMX-BF16, else oneDNN-packed"

    def add_rms_norm(
        self,
        x: torch.Tensor,
        h: torch.Tensor | None,
        h_scale: torch.Tensor | None,
        out_scale: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = add_norm_(x, h, h_scale, out_scale, eps)
        assert y is not None  # out_scale given
        return x, y

    def norm_rope(
        self, x: torch.Tensor, scale: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return norm_rope_(x, scale, cos, sin, eps)

    qk_norm_rope_cache = qk_norm_rope_cache.composed

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return geglu(gate, up)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return argmax_rows(logits)
