"""bf16 linear layers on Intel AMX for decode-sized batches (``csrc/amx_linear.c``).

A decode step streams every weight once for a handful of rows; oneDNN adds
~20 us of setup per call on top. ``linear`` runs a weight pre-packed by
``pack_weight`` into AMX's tile layout with no per-call setup. Each output is
one fp32 accumulation chain over ``k`` in order, + bias, rounded to bf16: the
result does not depend on the batch size or on which columns are computed
together (a product over concatenated weights equals the separate products bit
for bit). It is measured to equal oneDNN's for up to 16 rows on the shapes of
Gemma 3 270M, but that is oneDNN's choice, not a contract.

``amx_status()`` says why AMX cannot run here (None when it can): the CPU lacks
AMX-BF16, Linux refuses the tile state, or the native library does not build.
Weights need ``in_features`` a multiple of 32 (``supports``).
"""

from __future__ import annotations

import functools

import torch

from hybridkv.kernels.cpu.build import NativeBuildError, library
from hybridkv.kernels.cpu.ffi import bind, c_fn
from hybridkv.kernels.cpu.ops import check_cpu_tensor

#: The tile layout's granularity: 64 output columns per group, k in steps of 32.
GROUP, KSTEP = 64, 32


@functools.cache
def amx_status() -> str | None:
    """None when the AMX kernel runs on this machine, else why not (one line)."""
    try:
        lib = library()
    except NativeBuildError as exc:
        return str(exc).splitlines()[0]
    code = int(bind(lib, "hkv_amx_init")())
    if code == 1:
        return None
    if code == 0:
        return "this CPU has no AMX-BF16 tiles"
    if code == 2:
        return "the native library was built without AMX code (not x86-64, or gcc < 11)"
    return f"Linux refused the AMX tile state (arch_prctl errno {-code})"


def amx_available() -> bool:
    return amx_status() is None


def supports(weight: torch.Tensor) -> bool:
    """True for a CPU bf16 ``[out, in]`` weight with ``in`` a multiple of 32."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[1] % KSTEP == 0
        and weight.shape[1] > 0
    )


def _require() -> None:
    why = amx_status()
    if why is not None:
        raise RuntimeError(f"the AMX linear kernel cannot run here: {why}")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight [n, k]`` (bf16, ``supports``) in the tile layout: a flat bf16 tensor
    of ``ceil(n / 64) * 64 * k`` elements (columns past ``n`` are zero)."""
    if not supports(weight):
        raise ValueError(
            f"pack_weight: expected a CPU bf16 [out, in] weight with in % {KSTEP} == 0, "
            f"got {weight.dtype} {tuple(weight.shape)} on {weight.device}"
        )
    _require()
    n, k = weight.shape
    w = weight.detach().contiguous()
    out = torch.empty(-(-n // GROUP) * GROUP * k, dtype=torch.bfloat16)
    c_fn("hkv_amx_pack")(n, k, w.data_ptr(), out.data_ptr())
    return out


def linear(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``round(x @ W^T + bias)`` for ``x [m, k]`` bf16 (unit last stride), ``packed`` from
    ``pack_weight(W)``, ``bias`` fp32 ``[out_features]`` or None; returns bf16 ``[m, n]``."""
    check_cpu_tensor("x", x, torch.bfloat16, 2)
    m, k = x.shape
    n = out_features
    if k % KSTEP or packed.dtype != torch.bfloat16 or packed.numel() != -(-n // GROUP) * GROUP * k:
        raise ValueError(
            f"linear: packed weight of {packed.numel()} elements does not match "
            f"[{n}, {k}] (in % {KSTEP} == 0)"
        )
    if bias is not None and (
        bias.dtype != torch.float32 or bias.shape != (n,) or not bias.is_contiguous()
    ):
        raise ValueError(
            f"linear: bias must be a contiguous fp32 [{n}], got {bias.dtype} {tuple(bias.shape)}"
        )
    _require()
    y = torch.empty(m, n, dtype=torch.bfloat16)
    if m:
        b_ptr = bias.data_ptr() if bias is not None else 0
        c_fn("hkv_amx_linear")(m, n, k, x.data_ptr(), x.stride(0), packed.data_ptr(), b_ptr,
                              y.data_ptr(), n)  # fmt: skip
    return y
