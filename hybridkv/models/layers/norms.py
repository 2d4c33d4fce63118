"""RMS norms, computed in fp32 and cast back (the Hugging Face numerics).

``RMSNorm`` (Llama, Jamba): ``weight * x / rms(x)``, the weight applied after
casting back to the input dtype; it runs on the step's kernel backend
(``ops.rms_norm``). ``GemmaRMSNorm``: ``(1 + weight) * x / rms(x)`` with the
weight applied in fp32 before the cast; Gemma 3 hands ``scale_fp32()`` to the
backend's fused ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hybridkv.kernels.torch_backend import gemma_rms_norm

if TYPE_CHECKING:
    from hybridkv.kernels import KernelBackend


class RMSNorm(nn.Module):
    """Llama-style RMSNorm over the last dimension: the weight and ``eps`` of one
    ``ops.rms_norm`` call."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: KernelBackend) -> torch.Tensor:
        """``ops.rms_norm(x, weight, eps)``: ``x [..., size]`` -> a new tensor of its shape."""
        return ops.rms_norm(x, self.weight, self.eps)


class GemmaRMSNorm(nn.Module):
    """Gemma-style RMSNorm: ``(1 + weight)`` scaling, in fp32."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(x, 1.0 + self.weight.float(), self.eps)

    def scale_fp32(self) -> torch.Tensor:
        """``1 + weight`` in fp32, contiguous: the scale the backends' fused Gemma ops take.

        Cached, and recomputed when the weight is replaced or changed in place.
        """
        w = self.weight
        key = (w.data_ptr(), w._version, w.device)
        if getattr(self, "_scale_key", None) != key:
            self._scale = (1.0 + w.detach().float()).contiguous()
            self._scale_key = key
        return self._scale
