"""Optional mamba-ssm: its Triton decode kernel and its torch references.

mamba-ssm (2.3.x) ships only an sdist; built without CUDA its package
``__init__`` fails (it imports the CUDA extension ``selective_scan_cuda``),
but the submodules we need work: the Triton ``selective_state_update`` and
the pure-torch ``selective_state_update_ref``, ``selective_scan_ref``,
``ssd_chunk_scan_combined_ref`` and the gated ``rms_norm_ref`` (and, for GPU
benchmarks, the Triton ``mamba_chunk_scan_combined``). ``load_mamba_ssm()`` loads just those
submodules under a temporary bare ``mamba_ssm`` package (and, while loading
``selective_scan_interface``, a stub ``selective_scan_cuda``), then removes
every ``mamba_ssm*`` entry it added from ``sys.modules``: transformers binds
mamba-ssm kernels whenever ``import mamba_ssm`` succeeds, so nothing may leave
it importable. If the real package is already imported, it is used as is.

Nothing in hybridkv requires mamba-ssm; it is a test oracle and a CUDA backend.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

_PKG = "mamba_ssm"
_CUDA_EXT = "selective_scan_cuda"


@dataclass(frozen=True)
class MambaSsmOps:
    """The mamba-ssm callables hybridkv uses (signatures as in mamba-ssm)."""

    selective_state_update: Callable[..., object]  # Triton, (batch, [nheads,] dim, dstate)
    selective_state_update_ref: Callable[..., object]
    selective_scan_ref: Callable[..., object]  # u, delta: (batch, dim, L)
    ssd_chunk_scan_combined_ref: Callable[..., object]  # x: (batch, L, nheads, headdim)
    mamba_chunk_scan_combined: Callable[..., object]  # Triton, same layout as the ref
    rms_norm_ref: Callable[..., object]  # x, weight, bias, z, eps, group_size, norm_before_gate


def mamba_ssm_available() -> bool:
    """True when mamba-ssm and what its Triton/torch code imports are installed."""
    return all(importlib.util.find_spec(m) is not None for m in (_PKG, "einops", "triton"))


def _load_submodules() -> dict[str, types.ModuleType]:
    names = {
        "ssu": f"{_PKG}.ops.triton.selective_state_update",
        "ssd": f"{_PKG}.ops.triton.ssd_combined",
        "norm": f"{_PKG}.ops.triton.layernorm_gated",
    }
    scan = f"{_PKG}.ops.selective_scan_interface"
    if _PKG in sys.modules:  # the real package imported fine: use it
        mods = {k: importlib.import_module(v) for k, v in names.items()}
        mods["scan"] = importlib.import_module(scan)
        return mods
    spec = importlib.util.find_spec(_PKG)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{_PKG} is not installed")
    before = set(sys.modules)
    root = types.ModuleType(_PKG)
    root.__path__ = list(spec.submodule_search_locations)
    sys.modules[_PKG] = root
    try:
        mods = {k: importlib.import_module(v) for k, v in names.items()}
        stub_ext = _CUDA_EXT not in sys.modules
        if stub_ext:
            sys.modules[_CUDA_EXT] = types.ModuleType(_CUDA_EXT)
        mods["scan"] = importlib.import_module(scan)
    finally:
        for name in set(sys.modules) - before:
            if name in (_PKG, _CUDA_EXT) or name.startswith(_PKG + "."):
                del sys.modules[name]
    return mods


@functools.cache
def load_mamba_ssm() -> MambaSsmOps:
    """Load mamba-ssm's kernels and references (once); ``ImportError`` when unavailable."""
    if not mamba_ssm_available():
        raise ImportError(
            "mamba-ssm is not installed (or einops/triton is missing): run `make mamba`, "
            "or use the hybridkv kernels (backend='triton' or 'torch')"
        )
    mods = _load_submodules()
    return MambaSsmOps(
        selective_state_update=mods["ssu"].selective_state_update,
        selective_state_update_ref=mods["ssu"].selective_state_update_ref,
        selective_scan_ref=mods["scan"].selective_scan_ref,
        ssd_chunk_scan_combined_ref=mods["ssd"].ssd_chunk_scan_combined_ref,
        mamba_chunk_scan_combined=mods["ssd"].mamba_chunk_scan_combined,
        rms_norm_ref=mods["norm"].rms_norm_ref,
    )
