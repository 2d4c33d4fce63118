"""``torch``: the reference backend, every op in eager torch (runs on any device).

The norm and RoPE ops compute as Hugging Face's modules do, so a model built on
them matches transformers token for token: Gemma's (fp32 norms, the scale
applied before the cast back, cos/sin in the activations' dtype), Llama's
(``rms_norm``: the weight applied after the cast back) and Llama 4's
interleaved RoPE (fp32 pairs). The other backends take
from here the ops they have no kernel for (their ``fallbacks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch.nn import functional as F

from hybridkv.kernels import qk_norm_rope_cache
from hybridkv.kernels.registry import KernelBackend


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last dimension, in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def gemma_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's norm: ``normalize(x) * scale`` in fp32 (``scale = 1 + weight``), cast back."""
    return (rms_normalize(x, eps) * scale).type_as(x)


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Llama's norm: ``normalize(x)`` cast back to ``x``'s dtype, then ``* weight`` if any."""
    y = rms_normalize(x, eps).to(x.dtype)
    return y if weight is None else weight * y


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` along the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` with precomputed ``cos``/``sin`` (``rotate_half`` layout)."""
    return x * cos + rotate_half(x) * sin


def apply_rope_pairwise(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` by pairs ``(a, b) = (x[2j], x[2j+1])`` -> ``(a cos - b sin,
    a sin + b cos)`` in fp32 (``cos/sin [T, 1, D / 2]`` fp32), cast back."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [T, H, D / 2, 2]
    a, b = pairs[..., 0], pairs[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


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
        "rms_norm": "torch: fp32 norm, cast back, then * weight (Llama)",
        "add_rms_norm": "torch: fp32 norms, residual add in the activations' dtype",
        "norm_rope": "torch: fp32 per-head norm, then rotate_half RoPE",
        "qk_norm_rope_cache": "torch: norm_rope of q, of k, then cache_write (composed)",
        "rope_pairwise": "torch: fp32 rotation of adjacent pairs (Llama 4)",
        "gelu_tanh_mul": 'torch: F.gelu(approximate="tanh") * up',
        "greedy": "torch: logits.max(-1).indices (in the logits' dtype)",
        "causal_conv1d": "torch: one einsum over gathered taps (mamba/conv_prefill.py)",
        "selective_scan": "torch: sequential fp32 scan (mamba/ssm_scan.py)",
        "ssd_scan": "torch: sequential fp32 Mamba2 scan (mamba/ssd_scan.py)",
    }

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return llama_rms_norm(x, weight, eps)

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

    qk_norm_rope_cache = qk_norm_rope_cache.composed

    def rope_pairwise(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope_pairwise(x, cos, sin)

    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") * up

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return max_indices(logits)
