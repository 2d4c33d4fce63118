"""Checked Python entry points of the native CPU kernels (``csrc/hybridkv_cpu.c``).

Each op takes CPU tensors of one element type (bf16 or fp32) whose last
dimension is contiguous, checks shapes, dtypes and strides, and calls the C
function with raw pointers and element strides. Numerics: see the C file's
header (fp32 math, rounded where the eager torch ops round).

- ``add_norm_(x, h, h_weight, out_weight, eps, out)``: Gemma's residual step,
  ``x += round(norm(h) * h_weight)`` then ``out = norm(x) * out_weight``
  (either half optional); weights are fp32 ``1 + weight``.
- ``norm_rope_(x, weight, cos, sin, eps)``: per-head Gemma norm then RoPE, in place.
- ``geglu(gate, up)``: ``gelu_tanh(gate) * up``.
- ``cache_write(k, v, key_cache, value_cache, slot_mapping)``: ``reshape_and_cache``.
- ``decode_attention(...)``: decode rows of ``unified_attention`` read in place
  from the paged caches (``kernels/attention/native.py`` calls it).
- ``argmax_rows(logits)``: greedy sampling, ``logits.max(-1).indices`` without
  an fp32 copy of bf16 logits (``csrc/greedy.c``).

The AMX linear layers have their own module, ``amx.py``; the C prototypes are in
``ffi.py``.
"""

from __future__ import annotations

import torch

from hybridkv.kernels.cpu.ffi import c_fn

#: Element types the kernels take (the C ``bf16`` flag: 1 for bfloat16, 0 for fp32).
DTYPES = (torch.bfloat16, torch.float32)
#: Longest row the norm kernels take (their fp32 row buffers live on the stack),
#: and the longest head (norm_rope keeps four head-sized buffers, attention two).
MAX_NORM_DIM, MAX_HEAD_DIM = 16384, 4096
#: Query heads per KV head x head size that decode attention takes (2 fp32 buffers of it).
MAX_GROUP_FLOATS = 32768


def check_cpu_tensor(name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"{name}: the native kernels take CPU tensors, got {t.device}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype}, expected {dtype}")
    if t.dim() != ndim or t.stride(-1) != 1:
        raise ValueError(
            f"{name}: expected {ndim} dims with a unit last stride, got "
            f"shape {tuple(t.shape)} strides {t.stride()}"
        )


def _check_dtype(name: str, t: torch.Tensor) -> torch.dtype:
    if t.dtype not in DTYPES:
        raise ValueError(f"{name}: the native kernels take bf16 or fp32, got {t.dtype}")
    return t.dtype


def _check_weight(name: str, w: torch.Tensor, dim: int) -> None:
    if w.dtype != torch.float32 or w.shape != (dim,) or not w.is_contiguous():
        raise ValueError(
            f"{name}: expected a contiguous fp32 [{dim}] weight, got {w.dtype} {tuple(w.shape)}"
        )


def add_norm_(
    x: torch.Tensor,
    h: torch.Tensor | None,
    h_weight: torch.Tensor | None,
    out_weight: torch.Tensor | None,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``x [R, C]``: ``x += round(norm(h) * h_weight)`` (if ``h``), then return
    ``norm(x) * out_weight`` rounded (if ``out_weight``; written into ``out`` if given)."""
    dtype = _check_dtype("x", x)
    check_cpu_tensor("x", x, dtype, 2)
    rows, dim = x.shape
    if dim > MAX_NORM_DIM:
        raise ValueError(f"x: rows of {dim} exceed the native norm's {MAX_NORM_DIM}")
    h_ptr, hs, wh_ptr = 0, 0, 0
    if h is not None:
        check_cpu_tensor("h", h, dtype, 2)
        if h.shape != x.shape:
            raise ValueError(f"h: shape {tuple(h.shape)} differs from x's {tuple(x.shape)}")
        if h_weight is None:
            raise ValueError("h_weight: required with h")
        _check_weight("h_weight", h_weight, dim)
        h_ptr, hs, wh_ptr = h.data_ptr(), h.stride(0), h_weight.data_ptr()
    wo_ptr = o_ptr = os = 0
    if out_weight is not None:
        _check_weight("out_weight", out_weight, dim)
        if out is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        check_cpu_tensor("out", out, dtype, 2)
        if out.shape != x.shape:
            raise ValueError(f"out: shape {tuple(out.shape)} differs from x's {tuple(x.shape)}")
        wo_ptr, o_ptr, os = out_weight.data_ptr(), out.data_ptr(), out.stride(0)
    if rows:
        bf16 = dtype == torch.bfloat16
        c_fn("hkv_add_norm")(bf16, rows, dim, h_ptr, hs, wh_ptr, x.data_ptr(), x.stride(0),
                            wo_ptr, o_ptr, os, eps)  # fmt: skip
    return out if out_weight is not None else None


def norm_rope_(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """In place on ``x [T, H, D]``: per-head Gemma norm (``weight``: fp32 ``1 + w``,
    or None for none), then RoPE with ``cos``/``sin`` ``[T, D]`` or ``[T, 1, D]``
    (x's dtype, rotate_half layout). Returns ``x``."""
    dtype = _check_dtype("x", x)
    check_cpu_tensor("x", x, dtype, 3)
    t, heads, dim = x.shape
    if dim % 2 or dim > MAX_HEAD_DIM:
        raise ValueError(f"x: head size {dim} must be even and <= {MAX_HEAD_DIM}")
    cos, sin = cos.reshape(t, dim), sin.reshape(t, dim)
    check_cpu_tensor("cos", cos, dtype, 2)
    check_cpu_tensor("sin", sin, dtype, 2)
    if cos.stride() != sin.stride():
        raise ValueError("cos and sin must share strides")
    if weight is not None:
        _check_weight("weight", weight, dim)
    if t:
        w_ptr = weight.data_ptr() if weight is not None else 0
        c_fn("hkv_norm_rope")(dtype == torch.bfloat16, t, heads, dim, x.data_ptr(), x.stride(0),
                             x.stride(1), w_ptr, cos.data_ptr(), sin.data_ptr(), cos.stride(0),
                             eps)  # fmt: skip
    return x


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``round(round(gelu_tanh(gate)) * up)`` for ``[R, C]`` inputs (a new tensor)."""
    dtype = _check_dtype("gate", gate)
    check_cpu_tensor("gate", gate, dtype, 2)
    check_cpu_tensor("up", up, dtype, 2)
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    out = torch.empty(gate.shape, dtype=dtype)
    rows, cols = gate.shape
    if rows:
        c_fn("hkv_geglu")(dtype == torch.bfloat16, rows, cols, gate.data_ptr(), gate.stride(0),
                         up.data_ptr(), up.stride(0), out.data_ptr(), out.stride(0))  # fmt: skip
    return out


def cache_write(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``reshape_and_cache`` (arguments already checked by it) where each token's
    ``[Hkv, D]`` rows are contiguous in ``key``/``value`` and in the caches."""
    hkv, d = key.shape[1:]
    for name, t in (
        ("key", key),
        ("value", value),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
    ):
        if t.stride(-1) != 1 or t.stride(-2) != d:
            raise ValueError(
                f"{name}: the native cache write needs contiguous [Hkv, D] rows, "
                f"got strides {t.stride()}"
            )
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    slots = slots.contiguous()
    size = key.element_size()
    c_fn("hkv_cache_write")(key.shape[0], hkv * d * size, key.data_ptr(), key.stride(0) * size,
                           value.data_ptr(), value.stride(0) * size, slots.data_ptr(),
                           key_cache.data_ptr(), value_cache.data_ptr(),
                           key_cache.stride(0) * size, key_cache.stride(1) * size,
                           value_cache.stride(0) * size, value_cache.stride(1) * size,
                           key_cache.shape[1])  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    tables: torch.Tensor,
    q_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    softcap: float | None,
    window: int | None,
    chunk: int | None,
    sinks: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """Decode attention of ``q[q_rows]`` over the paged caches, into ``out[q_rows]``.

    ``tables [n, B]`` int32 (decode ``i``'s block table), ``q_rows``/``seq_lens``
    ``[n]`` int64, all contiguous; ``sinks`` fp32 ``[Hq]`` or None. Called by
    ``kernels/attention/native.py`` with ``unified_attention``'s checked inputs.
    """
    dtype = _check_dtype("q", q)
    n = q_rows.shape[0]
    hq, d = q.shape[1:]
    hkv = key_cache.shape[2]
    if d > MAX_HEAD_DIM or (hq // hkv) * d > MAX_GROUP_FLOATS:
        raise ValueError(
            f"{hq // hkv} query heads per KV head of size {d}: the native decode kernel takes "
            f"heads up to {MAX_HEAD_DIM} and groups up to {MAX_GROUP_FLOATS} values "
            "(its per-thread buffers live on the stack); use backend='torch'"
        )
    ks, vs = key_cache.stride(), value_cache.stride()
    c_fn("hkv_decode_attention")(
        dtype == torch.bfloat16, n, hq, hkv, d, q.data_ptr(), q.stride(0), q.stride(1),
        key_cache.data_ptr(), ks[0], ks[1], ks[2], value_cache.data_ptr(), vs[0], vs[1], vs[2],
        tables.data_ptr(), tables.stride(0), key_cache.shape[1],
        q_rows.data_ptr(), seq_lens.data_ptr(), scale, softcap or 0.0,
        window or 0, chunk or 0, sinks.data_ptr() if sinks is not None else 0,
        out.data_ptr(), out.stride(0), out.stride(1),
    )  # fmt: skip


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits [N, V]`` (bf16 or fp32) -> int64 ``[N]``: each row's first maximal index,
    as ``logits.max(-1).indices`` (a row with NaN: its first NaN)."""
    dtype = _check_dtype("logits", logits)
    check_cpu_tensor("logits", logits, dtype, 2)
    rows, cols = logits.shape
    if cols == 0:
        raise ValueError("logits: rows are empty")
    out = torch.empty(rows, dtype=torch.int64)
    if rows:
        c_fn("hkv_argmax_rows")(dtype == torch.bfloat16, rows, cols, logits.data_ptr(),
                               logits.stride(0), out.data_ptr())  # fmt: skip
    return out
