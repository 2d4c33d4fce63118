"""``triton``: attention, the cache write and the Mamba ops as Triton kernels.

CUDA tensors, or CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
tests only). The elementwise ops (norms, RoPE, GeGLU) and greedy sampling
have no Triton kernel: they come from the torch reference (``fallbacks``), which on CUDA is
one or two eager kernels each. This module does not import Triton; the kernel
modules the ops reach do, at their first call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

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
    }
    fallbacks: ClassVar[Mapping[str, type[KernelBackend]]] = {
        "rms_norm": TorchBackend,
        "add_rms_norm": TorchBackend,
        "norm_rope": TorchBackend,
        "rope_pairwise": TorchBackend,
        "gelu_tanh_mul": TorchBackend,
        "greedy": TorchBackend,
    }
