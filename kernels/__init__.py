"""hybridkv.kernels: ops on the shared paged KV layout, and the engine's kernel backends.

Two levels:

- The engine holds one ``KernelBackend`` (``registry.py``: ``get_backend(name,
  device)``; ``torch``, ``triton``, ``native``) carrying every op a model step
  calls; ``describe()`` tells which kernel runs each op and which ops a
  backend takes from another (declared ``fallbacks``, never silent).
- The public ops below are what the backends run. Each validates its
  arguments once, then runs Triton on CUDA tensors or its pure-torch reference
  on CPU tensors; ``backend="triton" | "torch" | "native"`` (or the
  ``HYBRIDKV_KERNEL_BACKEND`` environment variable) overrides the choice, and
  a backend the op does not offer, or that cannot run, raises
  ``KernelBackendError`` (``backend.py``). ``"native"`` is the C kernels of
  ``hybridkv.kernels.cpu`` (built at first use).

Importing this package needs neither Triton nor a C compiler: the Triton
kernel modules (``*_triton.py``, ``attention/launcher.py``) and the C library
load at the first call that runs them.

- ``reshape_and_cache``: write new K/V tokens at their slots;
- ``unified_attention`` with ``AttentionMetadata`` (built once per step and
  group) and ``AttentionOptions`` (per layer: window, chunk, softcap);
- Mamba state ops on state slots (``hybridkv.kernels.mamba``): decode steps
  ``causal_conv1d_update``, ``selective_state_update`` (Mamba1),
  ``ssd_state_update`` (Mamba2); varlen prefill chunks that start from a cached
  state and save block-boundary checkpoints: ``causal_conv1d_fn``,
  ``selective_scan_fn``, ``ssd_scan_fn`` (and ``selective_chunk_scan_fn``,
  ``ssd_chunk_scan_fn``: the same scans in chunked form).

Every op ``X`` also has ``X_ref`` (torch) and ``X_triton`` with the same
checked signature minus ``backend``; the attention and cache-write ops also
``X_native``.

Importable only as ``hybridkv.kernels``: a top-level ``kernels`` package would
shadow Hugging Face's hub-kernels package. Needs the ``engine`` extra (torch):
without it, importing raises ``MissingExtraError`` naming the ``pip install``.
"""

from hybridkv.kernels import _requires  # noqa: F401  (first: checks the engine extra)
from hybridkv.kernels.attention import (
    AttentionMetadata,
    AttentionOptions,
    unified_attention,
    unified_attention_native,
    unified_attention_ref,
    unified_attention_triton,
)
from hybridkv.kernels.backend import KernelBackendError, resolve_backend
from hybridkv.kernels.cache_write import (
    reshape_and_cache,
    reshape_and_cache_native,
    reshape_and_cache_ref,
    reshape_and_cache_triton,
)
from hybridkv.kernels.mamba import (
    causal_conv1d_fn,
    causal_conv1d_update,
    mamba_ssm_available,
    selective_chunk_scan_fn,
    selective_scan_fn,
    selective_state_update,
    ssd_chunk_scan_fn,
    ssd_scan_fn,
    ssd_state_update,
)
from hybridkv.kernels.qk_norm_rope_cache import QKNormRope
from hybridkv.kernels.registry import KernelBackend, backend_names, get_backend

__all__ = [
    "AttentionMetadata",
    "AttentionOptions",
    "KernelBackend",
    "KernelBackendError",
    "QKNormRope",
    "backend_names",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "get_backend",
    "mamba_ssm_available",
    "reshape_and_cache",
    "reshape_and_cache_native",
    "reshape_and_cache_ref",
    "reshape_and_cache_triton",
    "resolve_backend",
    "selective_chunk_scan_fn",
    "selective_scan_fn",
    "selective_state_update",
    "ssd_chunk_scan_fn",
    "ssd_scan_fn",
    "ssd_state_update",
    "unified_attention",
    "unified_attention_native",
    "unified_attention_ref",
    "unified_attention_triton",
]
