"""``triton``: attention, the cache write and the Mamba ops as Triton kernels.

CUDA tensors, or CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
tests only). The Gemma path's elementwise ops (residual add + norms, per-head norm +
RoPE, the q/k norm + RoPE with the cache write, GeGLU) and Llama's ``rms_norm`` are one
Triton kernel each
(``norms_triton.py``; as the torch reference, they were 5-10 eager kernels each).
Llama 4's pairwise RoPE and greedy sampling come from the torch reference
(``fallbacks``).
This module does not import Triton; the kernel modules the ops reach do, at their
first call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from hybridkv.kernels.qk_norm_rope_cache import QKNormRope
from hybridkv.kernels.qk_norm_rope_cache import check as check_qk_norm_rope_cache
from hybridkv.kernels.registry import KernelBackend
from hybridkv.kernels.torch_backend import TorchBackend


class TritonBackend(KernelBackend):
    """Triton kernels for attention, cache write and Mamba; the rest from torch."""

    name = "triton"
    kernels: ClassVar[Mapping[str, str]] = {
        "attention": "Triton: one varlen paged kernel, split-KV for small decode batches",
        "cache_write": "Triton: one program per token (cache_write_triton.py)",
        "causal_conv1d": "Triton: a program per (sequence, channel block) (conv_prefill_triton)",
        "selective_scan": "Triton: sequential scan per (sequence, channel block) (ssm_scan_triton)",
        "ssd_scan": "Triton: chunked SSD for long prefills, else sequential (mamba/scan_choice)",
        "add_rms_norm": "Triton: residual add and both Gemma norms, a program per row",
        "norm_rope": "Triton: per-head Gemma norm then RoPE, a program per (token, head)",
        "qk_norm_rope_cache": "Triton: q and k norm + RoPE, k and v into the cache, one launch",
        "gelu_tanh_mul": "Triton: GELU (tanh) rounded, times up, a program per row block",
        "rms_norm": "Triton: Llama's norm (fp32, rounded, then * weight), a program per row",
    }
    fallbacks: ClassVar[Mapping[str, type[KernelBackend]]] = {
        "rope_pairwise": TorchBackend,
        "greedy": TorchBackend,
    }

    def ssd_scan(self, *args: torch.Tensor | bool | None) -> torch.Tensor:
        """``ssd_scan_fn``'s positional arguments and result; the chunked form for long
        prefills (``mamba/scan_choice.py``), else the sequential one."""
        from hybridkv.kernels.mamba import ssd_chunk_scan_fn, ssd_scan_fn
        from hybridkv.kernels.mamba.scan_choice import use_chunked

        x, query_start_loc = args[0], args[10]  # ssd_scan_fn's x and query_start_loc
        assert isinstance(x, torch.Tensor) and isinstance(query_start_loc, torch.Tensor)
        chunked = use_chunked(x.shape[0], query_start_loc.shape[0] - 1)
        fn = ssd_chunk_scan_fn if chunked else ssd_scan_fn
        return fn(*args, backend="triton")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        from hybridkv.kernels import norms_triton

        return norms_triton.rms_norm(x, weight, eps)

    def add_rms_norm(
        self,
        x: torch.Tensor,
        h: torch.Tensor | None,
        h_scale: torch.Tensor | None,
        out_scale: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from hybridkv.kernels import norms_triton

        return norms_triton.add_rms_norm(x, h, h_scale, out_scale, eps)

    def norm_rope(
        self, x: torch.Tensor, scale: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
    ) -> torch.Tensor:
        from hybridkv.kernels import norms_triton

        return norms_triton.norm_rope(x, scale, cos, sin, eps)

    def qk_norm_rope_cache(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        norm: QKNormRope,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        from hybridkv.kernels import qk_norm_rope_cache_triton as fused

        check_qk_norm_rope_cache(q, k, v, norm, key_cache, value_cache, slot_mapping)
        return fused.launch(q, k, v, norm, key_cache, value_cache, slot_mapping)

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        from hybridkv.kernels import norms_triton

        return norms_triton.gelu_tanh_mul(gate, up)
