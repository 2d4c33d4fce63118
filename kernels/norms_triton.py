"""Triton kernels of the Gemma path's elementwise ops: residual add + norms, per-head
norm + RoPE, GeGLU (the ``triton`` backend's ``add_rms_norm``, ``norm_rope`` and
``gelu_tanh_mul``).

Why: on CUDA each of these ran as the torch reference, several eager kernels per
op (a Gemma norm alone is a cast, a square, a mean, an add, a reciprocal square
root and two products), so a Gemma 3 decoder layer launched about 70 kernels, and
a decode step of a small model was bound by launches, not by the GPU. Each op is
one kernel here.

Every value is rounded where the torch reference (``torch_backend.py``) rounds,
so that the engine stays token-identical to transformers: norms in fp32 with the
scale (``1 + weight``) applied before the cast back; the residual added in the
activations' dtype; RoPE's two products each rounded, then their sum; GELU
rounded before the product with ``up``. What can differ is fp32 summation order
(the row's mean of squares) and the last bit of ``tanh``.

One program per row (token) for the residual norm, per (token, head) for the
norm + RoPE, per (row, block of columns) for GeGLU. Imported at the first call
(``triton`` is optional).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import interpreter_enabled
from hybridkv.kernels.checks import CACHE_DTYPES, check_tensor

#: GeGLU columns per program.
GELU_BLOCK = 1024

#: Launch option of the norm kernels: no FMA contraction. With Triton's default
#: (contraction on), LLVM fused a rounded product into the next add (``norm_rope``
#: compiled to one ``fma.rn.bf16`` for RoPE's two products and their sum, and
#: ``add_rms_norm`` fused the residual add with the norm's last product), dropping a
#: rounding the reference makes: on an H100 the outputs then differed from torch's by
#: one or two ulps in about a fifth of the values (2026-11-26). torch's norms run as
#: separate kernels, so nothing in them is contracted. ``gelu_tanh_mul`` keeps the
#: default: torch's own GELU kernel is compiled with contraction too.
NO_FMA = {"enable_fp_fusion": False}


def _row_warps(block: int) -> int:
    """Warps for a program holding a whole row of ``block`` (a power of two) values:
    16 for 8,192 (Gemma 3 27B's 5,376 padded) keep 16 values of each tile per thread
    (4 warps: 187 registers; ``research/kernel_resources.py``)."""
    return max(4, min(16, block // 512))


@triton.jit
def _round(x, dtype, RNE_BF16: tl.constexpr):  # type: ignore[no-untyped-def]
    """fp32 ``x`` rounded to ``dtype``. Compiled, a cast rounds to nearest even; Triton's
    interpreter truncates fp32 -> bf16 (with or without ``fp_downcast_rounding``), so
    there (``RNE_BF16``) the rounding is made explicit on the bits (finite values)."""
    if RNE_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _rstd(x, mask, C, eps):  # type: ignore[no-untyped-def]
    """``rsqrt(mean(x^2) + eps)`` of an fp32 row of ``C`` (masked) values. Compiled,
    ``tl.math.rsqrt`` is the GPU's ``rsqrt.approx``, the instruction torch's CUDA
    ``rsqrt`` runs (``1.0 / tl.sqrt(v)`` compiles to ``sqrt.approx`` and ``div.full``, a
    few ulps from it), and ``div_rn`` an IEEE division (``/`` compiles to ``div.full``,
    up to 2 ulps off); the interpreter computes both exactly, as the CPU reference does."""
    return tl.math.rsqrt(tl.math.div_rn(tl.sum(tl.where(mask, x * x, 0.0), axis=0), C * 1.0) + eps)


@triton.jit
def _gemma_norm(x, mask, scale, C, eps):  # type: ignore[no-untyped-def]
    """fp32 ``x * rsqrt(mean(x^2) + eps) * scale`` over a row of ``C`` (masked) values."""
    return x * _rstd(x, mask, C, eps) * scale


@triton.jit
def _add_rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr, h_ptr, h_scale_ptr, out_scale_ptr, x_out_ptr, y_ptr,
    C, stride_x, stride_h, stride_xo, stride_y, eps,
    HAS_H: tl.constexpr, BLOCK: tl.constexpr, RNE_BF16: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_H:
        h = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
        hs = tl.load(h_scale_ptr + cols, mask=mask, other=0.0)
        hn = _round(_gemma_norm(h, mask, hs, C, eps), dtype, RNE_BF16)
        x = _round(x.to(tl.float32) + hn.to(tl.float32), dtype, RNE_BF16)
        tl.store(x_out_ptr + row * stride_xo + cols, x, mask=mask)
    s = tl.load(out_scale_ptr + cols, mask=mask, other=0.0)
    y = _round(_gemma_norm(x.to(tl.float32), mask, s, C, eps), dtype, RNE_BF16)
    tl.store(y_ptr + row * stride_y + cols, y, mask=mask)


@triton.jit
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, out_ptr, C, stride_x, stride_o, eps,
    HAS_W: tl.constexpr, BLOCK: tl.constexpr, RNE_BF16: tl.constexpr,
):  # fmt: skip
    # Llama's norm: normalize in fp32, round to x's dtype, then * weight, rounded to out's.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    y = _round(xf * _rstd(xf, mask, C, eps), x.dtype, RNE_BF16)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        y = _round(w.to(tl.float32) * y.to(tl.float32), out_ptr.dtype.element_ty, RNE_BF16)
    tl.store(out_ptr + row * stride_o + cols, y, mask=mask)


@triton.jit
def _norm_rope_row(row, scale_ptr, cos_row, sin_row, D, eps, BLOCK_D: tl.constexpr,  # type: ignore[no-untyped-def]
                   RNE_BF16: tl.constexpr):  # fmt: skip
    """One head's Gemma norm then RoPE: the ``[BLOCK_D]`` result (``row``'s dtype) for
    the ``D`` values at ``row``, with ``cos_row``/``sin_row`` of its token. Shared by
    ``norm_rope`` and ``qk_norm_rope_cache``: both round exactly as the reference."""
    d = tl.arange(0, BLOCK_D)
    mask = d < D
    half = D // 2
    # rotate_half: position d takes -x[d + D/2] in the first half, x[d - D/2] in the second.
    rot = tl.where(d < half, d + half, d - half)
    sign = tl.where(d < half, -1.0, 1.0)
    x = tl.load(row + d, mask=mask, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    rstd = _rstd(xf, mask, D, eps)
    xn = _round(xf * rstd * tl.load(scale_ptr + d, mask=mask, other=0.0), dtype, RNE_BF16)
    xr = tl.load(row + rot, mask=mask, other=0.0).to(tl.float32)
    xrn = _round(xr * rstd * tl.load(scale_ptr + rot, mask=mask, other=0.0), dtype, RNE_BF16)
    cos = tl.load(cos_row + d, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_row + d, mask=mask, other=0.0).to(tl.float32)
    a = _round(xn.to(tl.float32) * cos, dtype, RNE_BF16)
    b = _round(sign * xrn.to(tl.float32) * sin, dtype, RNE_BF16)
    return _round(a.to(tl.float32) + b.to(tl.float32), dtype, RNE_BF16)


@triton.jit
def _norm_rope_kernel(  # type: ignore[no-untyped-def]
    x_ptr, scale_ptr, cos_ptr, sin_ptr, out_ptr,
    D, stride_xt, stride_xh, stride_ct, stride_st, stride_ot, stride_oh, eps,
    BLOCK_D: tl.constexpr, RNE_BF16: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    out = _norm_rope_row(
        x_ptr + t * stride_xt + h * stride_xh, scale_ptr, cos_ptr + t * stride_ct,
        sin_ptr + t * stride_st, D, eps, BLOCK_D, RNE_BF16,
    )  # fmt: skip
    d = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out, mask=d < D)


@triton.jit
def _gelu_tanh_mul_kernel(  # type: ignore[no-untyped-def]
    gate_ptr, up_ptr, out_ptr, C, stride_g, stride_u, stride_o,
    BLOCK: tl.constexpr, RNE_BF16: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0)
    dtype = g.dtype
    gf = g.to(tl.float32)
    inner = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)  # sqrt(2 / pi)
    # tanh(z) = 2 sigmoid(2z) - 1; |z| <= 20 (fp32's tanh is +-1 from |z| ~ 9) keeps the
    # exp inside sigmoid finite.
    inner = tl.minimum(tl.maximum(inner, -20.0), 20.0)
    tanh = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
    gelu = _round(0.5 * gf * (1.0 + tanh), dtype, RNE_BF16)
    up = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    out = _round(gelu.to(tl.float32) * up, dtype, RNE_BF16)
    tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


def _row_major(name: str, t: torch.Tensor, ndim: int) -> None:
    check_tensor(name, t, ndim=ndim, dtypes=CACHE_DTYPES, unit_last_stride=True)


def _scale(name: str, s: torch.Tensor, n: int, dev: torch.device) -> None:
    check_tensor(name, s, shape=(n,), dtypes=(torch.float32,), device=dev, contiguous=True)


def add_rms_norm(
    x: torch.Tensor,
    h: torch.Tensor | None,
    h_scale: torch.Tensor | None,
    out_scale: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + norm(h) * h_scale, norm(that) * out_scale)`` for ``x, h [R, C]`` (fp32
    scales ``1 + weight``); without ``h`` the residual is ``x`` itself. New tensors."""
    _row_major("x", x, 2)
    rows, c = x.shape
    _scale("out_scale", out_scale, c, x.device)
    y = torch.empty_like(x)
    if h is not None:
        if h_scale is None:
            raise ValueError("h_scale: required with h")
        _row_major("h", h, 2)
        if h.shape != x.shape or h.dtype != x.dtype or h.device != x.device:
            raise ValueError(f"h: {tuple(h.shape)} {h.dtype} differs from x's")
        _scale("h_scale", h_scale, c, x.device)
        x_out = torch.empty_like(x)
    else:
        h, h_scale, x_out = x, out_scale, x  # unused pointers
    if rows:
        block = triton.next_power_of_2(c)
        _add_rms_norm_kernel[(rows,)](
            x, h, h_scale, out_scale, x_out, y,
            c, x.stride(0), h.stride(0), x_out.stride(0), y.stride(0), eps,
            HAS_H=x_out is not x, BLOCK=block, RNE_BF16=interpreter_enabled(),
            num_warps=_row_warps(block), **NO_FMA,
        )  # fmt: skip
    return x_out, y


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Llama's norm of ``x [..., C]`` over its last dimension: ``normalize(x)`` rounded to
    ``x``'s dtype, then ``* weight [C]`` if given, in the dtype torch would promote the
    product to. A new tensor of ``x``'s shape."""
    check_tensor("x", x, dtypes=CACHE_DTYPES, unit_last_stride=True)
    if x.dim() == 0:
        raise ValueError("x: needs at least one dimension")
    c = x.shape[-1]
    rows = x.reshape(-1, c)  # a view for row-major leading dimensions, else a copy
    out_dtype = x.dtype
    if weight is not None:
        check_tensor("weight", weight, shape=(c,), dtypes=CACHE_DTYPES, device=x.device,
                     contiguous=True)  # fmt: skip
        out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    if rows.shape[0] and c:
        block = triton.next_power_of_2(c)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight if weight is not None else rows, out, c, rows.stride(0),
            out.stride(0), eps, HAS_W=weight is not None, BLOCK=block,
            RNE_BF16=interpreter_enabled(), num_warps=_row_warps(block), **NO_FMA,
        )  # fmt: skip
    return out.view(x.shape)


def norm_rope(
    x: torch.Tensor, scale: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """Per-head Gemma norm of ``x [T, H, D]`` (fp32 ``scale [D]``), then RoPE with
    ``cos``/``sin`` ``[T, 1, D]`` or ``[T, D]`` (x's dtype, rotate_half layout). A new tensor."""
    _row_major("x", x, 3)
    t, heads, d = x.shape
    if d % 2:
        raise ValueError(f"x: head size {d} must be even")
    _scale("scale", scale, d, x.device)
    cos, sin = cos.reshape(t, d), sin.reshape(t, d)
    for name, v in (("cos", cos), ("sin", sin)):
        check_tensor(name, v, dtypes=(x.dtype,), device=x.device, unit_last_stride=True)
    out = torch.empty_like(x)
    if t:
        _norm_rope_kernel[(t, heads)](
            x, scale, cos, sin, out,
            d, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), out.stride(0),
            out.stride(1), eps, BLOCK_D=triton.next_power_of_2(d), RNE_BF16=interpreter_enabled(),
            **NO_FMA,
        )  # fmt: skip
    return out


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` for ``[R, C]`` inputs, GELU rounded first. A new tensor."""
    _row_major("gate", gate, 2)
    _row_major("up", up, 2)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must match")
    rows, c = gate.shape
    out = torch.empty_like(gate)
    if rows and c:
        block = min(GELU_BLOCK, triton.next_power_of_2(c))
        _gelu_tanh_mul_kernel[(rows, triton.cdiv(c, block))](
            gate, up, out, c, gate.stride(0), up.stride(0), out.stride(0), BLOCK=block,
            RNE_BF16=interpreter_enabled(),
        )  # fmt: skip
    return out
