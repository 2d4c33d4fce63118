"""``triton``: attention, the cache write and the Mamba ops as Triton kernels.

CUDA tensors, or CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``,
tests only). The elementwise Gemma ops and greedy sampling have no Triton
kernel: they come from the torch reference (``fallbacks``), which on CUDA is
already one or two fused-enough eager kernels each. This module does not
import Triton; the kernel modules it reaches do, at their first call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from hybridkv.kernels.attention import AttentionMetadata, AttentionOptions, unified_attention
from hybridkv.kernels.cache_write import reshape_and_cache
from hybridkv.kernels.mamba import causal_conv1d_fn, selective_scan_fn
from hybridkv.kernels.registry import KernelBackend
from hybridkv.kernels.torch_backend import TorchBackend


class TritonBackend(KernelBackend):
    """Triton kernels for attention, cache write and Mamba; the rest from torch."""

    name = "triton"
    fallbacks: ClassVar[Mapping[str, type[KernelBackend]]] = {
        "add_rms_norm": TorchBackend,
        "norm_rope": TorchBackend,
        "gelu_tanh_mul": TorchBackend,
        "greedy": TorchBackend,
    }

    def attention(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        opts: AttentionOptions,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Triton: one varlen paged kernel, split-KV for small decode batches"""
        return unified_attention(q, key_cache, value_cache, meta, opts, sinks=sinks,
                                 backend="triton")  # fmt: skip

    def cache_write(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Triton: one program per token (``cache_write_triton.py``)"""
        reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, backend="triton")

    def causal_conv1d(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None,
        conv_state: torch.Tensor,
        query_start_loc: torch.Tensor,
        initial_state_indices: torch.Tensor,
        save_state_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Triton: one program per (sequence, channel block) (``conv_prefill_triton.py``)"""
        return causal_conv1d_fn(x, weight, bias, activation, conv_state, query_start_loc,
                                initial_state_indices, save_state_indices,
                                backend="triton")  # fmt: skip

    def selective_scan(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor | None,
        z: torch.Tensor | None,
        dt_bias: torch.Tensor | None,
        dt_softplus: bool,
        ssm_state: torch.Tensor,
        query_start_loc: torch.Tensor,
        initial_state_indices: torch.Tensor,
        save_state_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Triton: sequential scan, one program per (sequence, channel block)"""
        return selective_scan_fn(x, dt, A, B, C, D, z, dt_bias, dt_softplus, ssm_state,
                                 query_start_loc, initial_state_indices, save_state_indices,
                                 backend="triton")  # fmt: skip
