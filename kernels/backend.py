"""Which implementation runs one op call: Triton, the torch reference, native C, or mamba-ssm.

This is the per-op layer under the engine's backend objects
(``hybridkv.kernels.backends``): every public op in ``hybridkv.kernels`` takes
``backend=None | "triton" | "torch" | "native" | "mamba_ssm"`` and offers the
names its ``Implementations`` table lists. ``None`` means: the
``HYBRIDKV_KERNEL_BACKEND`` environment variable if it is set, else Triton for
CUDA tensors and the torch reference for CPU tensors.

There is no fallback: a name the op does not offer (``"native"`` for a Mamba
op, which has no C kernel) raises ``KernelBackendError`` ("offers only ..."),
and so does one that cannot run here (Triton not installed, or on CPU tensors
without ``TRITON_INTERPRET=1`` set before ``hybridkv.kernels`` was imported;
native C where it does not build; mamba-ssm not installed). The engine's
backend objects declare which per-op implementation each of their ops uses.

Names are told apart here only (``_CHECKS``); ops look their implementation up
in their table.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hybridkv.common import env

ENV_VAR = env.KERNEL_BACKEND
BACKENDS = ("triton", "torch", "native", "mamba_ssm")


class KernelBackendError(ValueError, RuntimeError):
    """The requested backend cannot run this op here.

    A ``ValueError`` (a bad choice, like every argument error) and, as it
    always was, a ``RuntimeError``.
    """


def backend_from_environment() -> str | None:
    """``$HYBRIDKV_KERNEL_BACKEND``, or None when unset or empty (``hybridkv.common.env``)."""
    return env.kernel_backend()


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return env.triton_interpret()


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported (asked once: every op's backend check reads it)."""
    return importlib.util.find_spec("triton") is not None


def _check_torch(source: str, device: torch.device) -> None:
    """The torch reference runs on every device."""


def _check_triton(source: str, device: torch.device) -> None:
    if not triton_installed():
        raise KernelBackendError(f"{source}'triton': Triton is not installed")
    if device.type != "cuda" and not interpreter_enabled():
        raise KernelBackendError(
            f"{source}'triton' on {device.type} tensors needs Triton's interpreter: set "
            "TRITON_INTERPRET=1 before hybridkv.kernels is imported, or use backend='torch'"
        )


def _check_native(source: str, device: torch.device) -> None:
    if device.type != "cpu":
        raise KernelBackendError(f"{source}'native' runs on CPU tensors only, not {device.type}")
    from hybridkv.kernels.cpu import native_status

    why = native_status()
    if why is not None:
        raise KernelBackendError(f"{source}'native': {why}")


def _check_mamba_ssm(source: str, device: torch.device) -> None:
    from hybridkv.kernels.mamba.mamba_ssm_compat import mamba_ssm_available

    if not mamba_ssm_available():
        raise KernelBackendError(
            "backend='mamba_ssm': mamba-ssm (and einops, triton) is not installed"
        )
    if device.type != "cuda" and not interpreter_enabled():
        raise KernelBackendError(
            f"backend='mamba_ssm' runs mamba-ssm's Triton kernel, which needs CUDA tensors "
            f"(got {device.type}); use backend='torch'"
        )


#: Per backend name, a check that raises ``KernelBackendError`` where it cannot run.
_CHECKS: Mapping[str, Callable[[str, torch.device], None]] = {
    "torch": _check_torch,
    "triton": _check_triton,
    "native": _check_native,
    "mamba_ssm": _check_mamba_ssm,
}


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
        if device.type != "cuda":
            return "torch"
        if not triton_installed():
            raise KernelBackendError(
                "CUDA tensors need Triton, which is not installed; pass backend='torch' "
                "to run the torch reference on the GPU"
            )
        return "triton"
    source = "backend=" if requested is not None else f"{ENV_VAR}="
    if name not in BACKENDS:
        raise KernelBackendError(f"{source}{name!r}: unknown backend; choose one of {BACKENDS}")
    if name not in allowed:
        raise KernelBackendError(f"{source}{name!r}: this op offers only {allowed}")
    _CHECKS[name](source, device)
    return name


@functools.cache
def _load(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), attr)
    return fn


class Implementations:
    """One op's implementation per backend name, in the order the op offers them.

    A value is the callable, or ``"module:attr"`` for one imported at its first
    use (the Triton and C modules, so that ``import hybridkv.kernels`` needs
    neither Triton nor a C compiler). ``impls[name]`` is the callable.
    """

    __slots__ = ("_table", "names")

    def __init__(self, **impls: Callable[..., Any] | str) -> None:
        unknown = set(impls) - set(BACKENDS)
        assert not unknown, f"not backend names: {sorted(unknown)}"
        self._table = impls
        self.names: tuple[str, ...] = tuple(impls)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        impl = self._table[name]
        return _load(impl) if isinstance(impl, str) else impl

    def source(self, name: str) -> str:
        """Where ``name``'s implementation lives (``module:attr``), for ``describe()``."""
        impl = self._table[name]
        if isinstance(impl, str):
            return impl
        return f"{impl.__module__}:{impl.__qualname__}"


def pinned(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    """``fn`` with ``backend`` fixed: ``X_ref = pinned(X, "torch")``, ``X_triton = ...``.

    Same arguments and checks as ``fn``; the variant exists so that tests and
    benchmarks can name one implementation without a keyword.
    """
    variant = functools.partial(fn, backend=backend)
    functools.update_wrapper(variant, fn)
    suffix = {"torch": "ref"}.get(backend, backend)
    variant.__name__ = variant.__qualname__ = f"{fn.__name__}_{suffix}"  # type: ignore[attr-defined]
    variant.__doc__ = f"``{fn.__name__}`` on backend {backend!r} (same arguments and checks)."
    return variant
