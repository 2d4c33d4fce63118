"""``torch``: the reference backend, every op in eager torch (runs on any device).

The Gemma ops compute as Hugging Face's modules do (fp32 norms, the scale
applied before the cast back, cos/sin in the activations' dtype), so a model
built on them matches transformers token for token. The other backends take
from here the ops they have no kernel for (their ``fallbacks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch.nn import functional as F

from hybridkv.kernels.registry import KernelBackend


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last dimension, in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def gemma_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's norm: ``normalize(x) * scale`` in fp32 (``scale = 1 + weight``), cast back."""
    return (rms_normalize(x, eps) * scale).type_as(x)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` along the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` with precomputed ``cos``/``sin`` (``rotate_half`` layout)."""
    return x * cos + rotate_half(x) * sin


def max_indices(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximal index, compared in the logits' dtype."""
    # max(...).indices: the first maximal index, like argmax, and ~3x faster on CPU.
    return logits.max(-1).indices


class TorchBackend(KernelBackend):
    """The references: every op in eager torch."""

    name = "torch"
    kernels: ClassVar[Mapping[str, str]] = {
        "attention": "torch: gathered pages, batched SDPA (attention/reference.py)",
        "cache_write": "torch: one masked index_put per cache (cache_write.py)",
        "add_rms_norm": "torch: fp32 norms, residual add in the activations' dtype",
        "norm_rope": "torch: fp32 per-head norm, then rotate_half RoPE",
        "gelu_tanh_mul": 'torch: F.gelu(approximate="tanh") * up',
        "greedy": "torch: logits.max(-1).indices (in the logits' dtype)",
        "causal_conv1d": "torch: one einsum over gathered taps (mamba/conv_prefill.py)",
        "selective_scan": "torch: sequential fp32 scan (mamba/ssm_scan.py)",
    }

    def add_rms_norm(
        self,
        x: torch.Tensor,
        h: torch.Tensor | None,
        h_scale: torch.Tensor | None,
        out_scale: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if h is not None:
            assert h_scale is not None, "h_scale: required with h"
            x = x + gemma_rms_norm(h, h_scale, eps)
        return x, gemma_rms_norm(x, out_scale, eps)

    def norm_rope(
        self, x: torch.Tensor, scale: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
    ) -> torch.Tensor:
        return apply_rope(gemma_rms_norm(x, scale, eps), cos, sin)

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") * up

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return max_indices(logits)
