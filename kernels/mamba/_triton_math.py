"""``@triton.jit`` helpers shared by the Mamba kernels (fp32 in, fp32 out)."""

from __future__ import annotations

import triton
import triton.language as tl


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
