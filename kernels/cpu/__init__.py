"""Native CPU kernels: fused per-layer work for the engine's CPU decode step.

C compiled at first use (``build.py``), called through ctypes (``ops.py``).
They exist because eager torch spends most of a CPU decode step on many
small ops (see ``benchmarks/results/engine.md``): here a layer's norms,
residual adds, RoPE, GeGLU, cache write and decode attention are a handful of
calls, the attention reading the paged cache in place. ``amx.py`` runs
decode-sized bf16 linear layers on Intel AMX tiles; ``argmax_rows`` is greedy
sampling without an fp32 copy of the logits.
"""

from hybridkv.kernels.cpu.build import NativeBuildError, library, native_status
from hybridkv.kernels.cpu.ops import (
    add_norm_,
    argmax_rows,
    cache_write,
    decode_attention,
    geglu,
    norm_rope_,
)

__all__ = [
    "NativeBuildError",
    "add_norm_",
    "argmax_rows",
    "cache_write",
    "decode_attention",
    "geglu",
    "library",
    "native_status",
    "norm_rope_",
]
