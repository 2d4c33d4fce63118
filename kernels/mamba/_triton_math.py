"""Triton helpers shared by the Mamba kernels: ``@triton.jit`` math (fp32 in, fp32
out), a state tile's load from and save to its slot, and the conv kernels'
constexpr flags. Imported only by the ``*_triton`` modules."""

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


@triton.jit
def load_state(state_ptr, slot, stride_slot, offs, rows, num_rows, cols_mask):  # type: ignore[no-untyped-def]
    """A state tile (``offs``: ``[rows, cols]`` offsets within a slot) of slot ``slot``, in
    fp32; zeros where ``slot < 0`` (the sequence starts from no state), where
    ``rows >= num_rows`` and where ``cols_mask`` is false."""
    # A negative slot reads nothing: no row is below 0 (slot 0's address is never read).
    mask = (rows[:, None] < tl.where(slot >= 0, num_rows, 0)) & cols_mask[None, :]
    tile = tl.load(state_ptr + tl.maximum(slot, 0) * stride_slot + offs, mask=mask, other=0.0)
    return tile.to(tl.float32)


@triton.jit
def save_state(state_ptr, slot, stride_slot, offs, tile, rows, num_rows, cols_mask):  # type: ignore[no-untyped-def]
    """Store ``tile`` in the state's dtype at ``offs`` of slot ``slot``; nothing where
    ``slot < 0`` (no save), ``rows >= num_rows`` or ``cols_mask`` is false."""
    mask = (rows[:, None] < tl.where(slot >= 0, num_rows, 0)) & cols_mask[None, :]
    ptrs = state_ptr + tl.maximum(slot, 0) * stride_slot + offs
    tl.store(ptrs, tile.to(state_ptr.dtype.element_ty), mask=mask)


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
