"""Triton helpers shared by the Mamba kernels: ``@triton.jit`` math (fp32 in, fp32
out) and the conv kernels' constexpr flags. Imported only by the ``*_triton`` modules."""

from __future__ import annotations

import triton
import triton.language as tl

from hybridkv.kernels.mamba.args import ConvArgs


@triton.jit
def softplus(x):  # type: ignore[no-untyped-def]
    # log1p(exp(x)) without log1p (not portable to the interpreter): Goldberg's
    # trick log(u) * e / (u - 1) with u = 1 + e is accurate for tiny e.
    # Identity above 20 like torch's softplus and mamba-ssm.
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def silu(x):  # type: ignore[no-untyped-def]
    return x * tl.sigmoid(x)


def conv_kernel_flags(a: ConvArgs, block_d: int) -> dict[str, int | bool]:
    """The conv kernels' ``W``/``BLOCK_W``/``BLOCK_D``/``HAS_BIAS``/``SILU`` constexprs."""
    width = a.weight.shape[1]
    return {
        "W": width,
        "BLOCK_W": triton.next_power_of_2(width - 1),
        "BLOCK_D": block_d,
        "HAS_BIAS": a.bias is not None,
        "SILU": a.activation == "silu",
    }
