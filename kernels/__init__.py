"""hybridkv.kernels: ops on the shared paged KV layout.

Each op validates its arguments once, then runs Triton on CUDA tensors or its
pure-torch reference on CPU tensors; ``backend="triton" | "torch"`` (or the
``HYBRIDKV_KERNEL_BACKEND`` environment variable) overrides the choice, and a
backend that cannot run raises instead of falling back (see ``backend.py``).

- ``reshape_and_cache``: write new K/V tokens at their slots;
- ``unified_attention`` with ``AttentionMetadata`` (built once per step and
  group) and ``AttentionOptions`` (per layer: window, chunk, softcap);
- Mamba state ops, in ``hybridkv.kernels.mamba``.

Importable only as ``hybridkv.kernels``: a top-level ``kernels`` package would
shadow Hugging Face's hub-kernels package.
"""

from hybridkv.kernels.attention import AttentionMetadata, AttentionOptions, unified_attention
from hybridkv.kernels.backend import KernelBackendError, resolve_backend
from hybridkv.kernels.cache_write import reshape_and_cache

__all__ = [
    "AttentionMetadata",
    "AttentionOptions",
    "KernelBackendError",
    "reshape_and_cache",
    "resolve_backend",
    "unified_attention",
]
