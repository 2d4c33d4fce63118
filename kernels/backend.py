"""Which implementation runs an op: Triton, the torch reference, native C, or mamba-ssm.

Every public op in ``hybridkv.kernels`` takes ``backend=None | "triton" |
"torch" | "native"`` (Mamba decode updates also accept ``"mamba_ssm"``).
``"native"`` (CPU tensors only) runs the compiled C kernels of
``hybridkv.kernels.cpu`` where the op has one (unified attention's decode
rows, ``reshape_and_cache``) and the op's torch reference where it has none
(the Mamba ops, attention's prefill chunks). ``None`` means:
the ``HYBRIDKV_KERNEL_BACKEND`` environment variable if it is set, else
Triton for CUDA tensors and the torch reference for CPU tensors.

There is no silent fallback: asking for Triton where it cannot run (CPU
tensors without ``TRITON_INTERPRET=1`` set before ``hybridkv.kernels`` was
imported, or Triton not installed) raises ``KernelBackendError`` saying why.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from hybridkv import env

ENV_VAR = env.KERNEL_BACKEND
BACKENDS = ("triton", "torch", "native", "mamba_ssm")


class KernelBackendError(ValueError, RuntimeError):
    """The requested backend cannot run this op here.

    A ``ValueError`` (a bad choice, like every argument error) and, as it
    always was, a ``RuntimeError``.
    """


def backend_from_environment() -> str | None:
    """``$HYBRIDKV_KERNEL_BACKEND``, or None when unset or empty (``hybridkv.env``)."""
    return env.kernel_backend()


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return env.triton_interpret()


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(
    requested: str | None, device: torch.device, allowed: tuple[str, ...] = ("triton", "torch")
) -> str:
    """The backend that runs an op on tensors of ``device``.

    ``requested`` wins over the environment variable, which wins over the
    device default. Raises ``KernelBackendError`` for an unknown name, a
    backend this op does not offer (``allowed``) or one that cannot run here.
    """
    name = requested if requested is not None else backend_from_environment()
    if name is None:
        name = "triton" if device.type == "cuda" else "torch"
        if name == "triton" and not triton_installed():
            raise KernelBackendError(
                "CUDA tensors need Triton, which is not installed; pass backend='torch' "
                "to run the torch reference on the GPU"
            )
        return name
    source = "backend=" if requested is not None else f"{ENV_VAR}="
    if name not in BACKENDS:
        raise KernelBackendError(f"{source}{name!r}: unknown backend; choose one of {BACKENDS}")
    if name == "native":
        _check_native(source, device)
        return name if name in allowed else "torch"
    if name not in allowed:
        raise KernelBackendError(f"{source}{name!r}: this op offers only {allowed}")
    if name == "triton":
        if not triton_installed():
            raise KernelBackendError(f"{source}'triton': Triton is not installed")
        if device.type != "cuda" and not interpreter_enabled():
            raise KernelBackendError(
                f"{source}'triton' on {device.type} tensors needs Triton's interpreter: set "
                "TRITON_INTERPRET=1 before hybridkv.kernels is imported, or use backend='torch'"
            )
    return name


def _check_native(source: str, device: torch.device) -> None:
    if device.type != "cpu":
        raise KernelBackendError(f"{source}'native' runs on CPU tensors only, not {device.type}")
    from hybridkv.kernels.cpu import native_status

    why = native_status()
    if why is not None:
        raise KernelBackendError(f"{source}'native': {why}")


def pinned(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    """``fn`` with ``backend`` fixed: ``X_ref = pinned(X, "torch")``, ``X_triton = ...``.

    Same arguments and checks as ``fn``; the variant exists so that tests and
    benchmarks can name one implementation without a keyword.
    """
    variant = functools.partial(fn, backend=backend)
    functools.update_wrapper(variant, fn)
    suffix = "ref" if backend == "torch" else backend
    variant.__name__ = variant.__qualname__ = f"{fn.__name__}_{suffix}"  # type: ignore[attr-defined]
    variant.__doc__ = f"``{fn.__name__}`` on backend {backend!r} (same arguments and checks)."
    return variant
