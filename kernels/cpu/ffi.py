"""The C functions of ``csrc/*.c`` as ctypes prototypes: one typed table, one loader.

Each entry copies its C prototype argument by argument (``int`` flag, ``i64``,
pointer, ``float``), so a mismatch reads as a diff against the C file. ``c_fn``
loads a function with its ``argtypes``/``restype`` set once; ``ops.py`` and
``amx.py`` call only through it. Pointers are passed as ``tensor.data_ptr()``.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

from hybridkv.kernels.cpu.build import library

FLAG, I64, PTR, F32 = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float

#: name -> (restype, argtypes); argument names as in the C source.
PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # hybridkv_cpu.c
    "hkv_add_norm": (None, (
        FLAG, I64, I64,            # bf16, rows, dim
        PTR, I64, PTR,             # h, hs, wh
        PTR, I64,                  # x, xs
        PTR, PTR, I64,             # wo, out, os
        F32,                       # eps
    )),
    "hkv_norm_rope": (None, (
        FLAG, I64, I64, I64,       # bf16, tokens, heads, dim
        PTR, I64, I64,             # x, xst, xsh
        PTR, PTR, PTR, I64,        # w1p, cos, sin, cst
        F32,                       # eps
    )),
    "hkv_geglu": (None, (
        FLAG, I64, I64,            # bf16, rows, cols
        PTR, I64, PTR, I64,        # gate, gs, up, us
        PTR, I64,                  # out, os
    )),
    "hkv_cache_write": (None, (
        I64, I64,                  # tokens, row_bytes
        PTR, I64, PTR, I64,        # k, kst, v, vst
        PTR, PTR, PTR,             # slots, kc, vc
        I64, I64, I64, I64,        # ksb, kso, vsb, vso
        I64,                       # bs
    )),
    "hkv_decode_attention": (None, (
        FLAG, I64, I64, I64, I64,  # bf16, n, hq, hkv, dim
        PTR, I64, I64,             # q, qst, qsh
        PTR, I64, I64, I64,        # kc, ksb, kso, ksh
        PTR, I64, I64, I64,        # vc, vsb, vso, vsh
        PTR, I64, I64,             # tables, table_stride, bs
        PTR, PTR,                  # q_rows, seq_lens
        F32, F32, I64, I64,        # scale, softcap, window, chunk
        PTR, PTR, I64, I64,        # sinks, out, ost, osh
    )),
    # greedy.c
    "hkv_argmax_rows": (None, (
        FLAG, I64, I64,            # bf16, rows, cols
        PTR, I64, PTR,             # logits, rs, out
    )),
    # row_copy.c
    "hkv_copy_rows": (None, (
        I64, I64,                  # parts, n
        PTR, PTR, PTR,             # dst_base, dst_stride, dst_rows
        PTR, PTR, PTR,             # src_base, src_stride, src_rows
        PTR,                       # sizes
    )),
    # amx_linear.c
    "hkv_amx_init": (ctypes.c_int, ()),
    "hkv_amx_pack": (None, (I64, I64, PTR, PTR)),  # n, k, w, out
    "hkv_amx_linear": (None, (
        I64, I64, I64,             # m, n, k
        PTR, I64, PTR, PTR,        # x, xs, wp, bias
        PTR, I64,                  # y, ys
    )),
}  # fmt: skip


def bind(lib: Any, name: str) -> Callable[..., Any]:
    """``lib``'s C function ``name`` with its prototype from ``PROTOTYPES`` set."""
    restype, argtypes = PROTOTYPES[name]
    fn = getattr(lib, name)
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn


@functools.cache
def c_fn(name: str) -> Callable[..., Any]:
    """The C function ``name`` of the native library, prototype set (builds the library
    on first use; ``NativeBuildError`` where it cannot)."""
    return bind(library(), name)
