"""The engine's kernel backends: one ``KernelBackend`` object per engine, by name.

A backend carries every op the models and the sampler call (``OPS``): paged
attention and its cache write, the norms (Llama's ``rms_norm``, the fused Gemma
residual norms) and RoPE (Gemma's norm + RoPE, alone or fused with the q/k pair and
the cache write; Llama 4's interleaved form), the
GeGLU activation, greedy sampling and the Mamba ops, plus how linear layers are
packed (``amx_linears``). Models call ``batch.ops.attention(...)`` and never
look at a backend's name.

The attention, cache-write and Mamba ops run the public per-op functions
(``unified_attention``... with ``backend=`` the backend's name); the norm,
RoPE and activation ops and greedy sampling are methods each backend implements. For every op it
lacks, a backend names the backend class that runs it instead (``fallbacks``):
that is the only way an op comes from elsewhere, it is checked when the class
is defined (every op is described or declared, never both), and
``describe()`` prints it::

    torch   the references; every op
    triton  attention, cache write, Mamba ops in Triton; norms, RoPE, GeGLU,
            greedy from torch (declared)
    native  C kernels on the CPU: cache write, decode attention (its prefill
            rows: the torch reference, declared in the op), Gemma norms and
            RoPE, GeGLU, greedy; Llama's rms_norm, interleaved RoPE and the
            Mamba ops from torch (declared)

The registry maps a name to its class by ``"module:Class"`` so that a backend's
module (and Triton, and the C build) loads only when that backend is asked for;
``register`` adds one. ``get_backend(name, device)`` checks that it can run on
``device`` (``KernelBackendError`` saying why not, as ``resolve_backend``) and
returns the one shared instance.
"""

from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from hybridkv.kernels.attention import unified_attention
from hybridkv.kernels.backend import resolve_backend
from hybridkv.kernels.cache_write import reshape_and_cache
from hybridkv.kernels.mamba import causal_conv1d_fn, selective_scan_fn, ssd_scan_fn
from hybridkv.kernels.qk_norm_rope_cache import QKNormRope

#: The ops every backend provides, in ``describe()`` order.
OPS = (
    "attention",
    "cache_write",
    "rms_norm",
    "add_rms_norm",
    "norm_rope",
    "qk_norm_rope_cache",
    "rope_pairwise",
    "gelu_tanh_mul",
    "greedy",
    "causal_conv1d",
    "selective_scan",
    "ssd_scan",
)


def _delegate(source: type[KernelBackend], op: str) -> Any:
    """``op`` of a ``source`` instance, as a method of another backend (a declared fallback)."""
    run_there = getattr(source(), op)

    def run(self: KernelBackend, *args: Any, **kwargs: Any) -> Any:
        return run_there(*args, **kwargs)

    run.__doc__ = f"{op} of backend {source.name!r} (declared fallback)"
    return run


def _public_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A method running the public op ``fn`` with ``backend=`` this backend's name
    (``fn``'s arguments, checks and docstring)."""

    def run(self: KernelBackend, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, backend=self.name, **kwargs)

    functools.update_wrapper(run, fn)
    return run


class KernelBackend(ABC):
    """Every op a model step calls, implemented once per backend (see the module docstring).

    Subclasses set ``name``, describe each op they run (``kernels``: op -> one
    line) and map each op they lack to the backend class that runs it
    (``fallbacks``). Instances hold no state: one per engine, shared.
    """

    name: ClassVar[str]
    #: op -> what runs it here, one line (``describe()``); the ops this backend runs.
    kernels: ClassVar[Mapping[str, str]] = {}
    #: op -> the backend class whose implementation this backend uses for it.
    fallbacks: ClassVar[Mapping[str, type[KernelBackend]]] = {}
    #: Whether linear layers also get the AMX decode kernel (``PackedLinear``, CPU bf16).
    amx_linears: ClassVar[bool] = False
    #: What runs linear layers, for ``describe()``.
    linear_kernels: ClassVar[str] = "torch F.linear (oneDNN-packed for CPU bf16: PackedLinear)"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for op, source in cls.fallbacks.items():
            if op not in OPS:
                raise TypeError(f"{cls.__name__}.fallbacks: {op!r} is not an op ({OPS})")
            if op in cls.kernels or op in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} both implements {op!r} and takes it from {source.__name__}"
                )
            setattr(cls, op, _delegate(source, op))
        covered = sorted([*cls.kernels, *cls.fallbacks])
        if covered != sorted(OPS):
            raise TypeError(
                f"{cls.__name__}: kernels and fallbacks must name every op once; "
                f"got {covered}, ops are {sorted(OPS)}"
            )

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<KernelBackend {self.name}>"

    def runs(self, op: str) -> str:
        """The backend whose implementation runs ``op`` here (its name)."""
        source = self.fallbacks.get(op)
        return source.name if source is not None else self.name

    def describe(self) -> str:
        """A table: for each op, the backend that runs it and its kernel (one line each)."""
        rows = [("op", "runs on", "kernel")]
        for op in OPS:
            source = self.fallbacks.get(op)
            if source is None:
                rows.append((op, self.name, self.kernels[op]))
            else:
                rows.append((op, f"{source.name} (fallback)", source.kernels[op]))
        rows.append(("linear", self.name, self.linear_kernels))
        width = [max(len(r[i]) for r in rows) for i in range(2)]
        lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows]
        return f"kernel backend {self.name!r}\n" + "\n".join(lines)

    # -- the public per-op functions, pinned to this backend -----------------------
    #: ``unified_attention`` (same contract): ``q [T, Hq, D]`` -> ``[T, Hq, D]``.
    attention = _public_op(unified_attention)
    #: ``reshape_and_cache`` (same contract): write new K/V rows at their slots.
    cache_write = _public_op(reshape_and_cache)

    # -- norms and RoPE ------------------------------------------------------------
    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        """Llama's RMS norm of ``x [..., C]`` over the last dimension, a new tensor.

        Normalised in fp32, cast back to ``x``'s dtype, then multiplied by
        ``weight [C]`` (in the product's promoted dtype, as Hugging Face's
        ``LlamaRMSNorm``); ``weight=None``: the weightless ("L2") norm.
        """

    @abstractmethod
    def add_rms_norm(
        self,
        x: torch.Tensor,
        h: torch.Tensor | None,
        h_scale: torch.Tensor | None,
        out_scale: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma residual step ``(x + norm(h) * h_scale, norm(that) * out_scale)``.

        ``x, h [R, C]``; scales are fp32 ``1 + weight`` ``[C]`` applied before the
        cast back (Gemma numerics); without ``h`` only the output norm. Returns
        ``(residual, normed)``; ``x`` may be updated in place and returned:
        callers use the returned residual, never ``x`` afterwards.
        """

    @abstractmethod
    def norm_rope(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        """Per-head Gemma norm then RoPE of ``x [T, H, D]`` (``cos/sin [T, 1, D]``).

        ``x`` may be rotated in place and returned: use the result.
        """

    @abstractmethod
    def qk_norm_rope_cache(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        norm: QKNormRope,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """``norm_rope(q)`` returned; ``norm_rope(k)`` and ``v`` written into the caches at
        ``slot_mapping`` (``cache_write``), ``norm``: the scales, cos/sin and eps. The
        contract: ``qk_norm_rope_cache.py``."""

    @abstractmethod
    def rope_pairwise(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Llama 4's RoPE of ``x [T, H, D]`` on adjacent pairs ``(x[2j], x[2j+1])``, a new tensor.

        ``cos/sin [T, 1, D / 2]`` fp32 (frequency ``j`` per pair); the rotation
        runs in fp32 and is cast back to ``x``'s dtype.
        """

    # -- activation ----------------------------------------------------------------
    @abstractmethod
    def gelu_tanh_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """``gelu_tanh(gate) * up`` rounded as eager torch rounds (GeGLU), a new tensor."""

    # -- sampling ------------------------------------------------------------------
    @abstractmethod
    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [N, V]`` -> int64 ``[N]``: each row's first maximal index."""

    # -- Mamba (public per-op functions, pinned to this backend) --------------------
    #: ``causal_conv1d_fn`` (same contract): varlen conv from and into state slots.
    causal_conv1d = _public_op(causal_conv1d_fn)
    #: ``selective_scan_fn`` (same contract): varlen Mamba1 scan over state slots.
    selective_scan = _public_op(selective_scan_fn)
    #: ``ssd_scan_fn`` (same contract): varlen Mamba2 (SSD) scan over state slots.
    ssd_scan = _public_op(ssd_scan_fn)


#: name -> ``"module:Class"``, loaded on first request.
_REGISTRY: dict[str, str] = {
    "torch": "hybridkv.kernels.torch_backend:TorchBackend",
    "triton": "hybridkv.kernels.triton_backend:TritonBackend",
    "native": "hybridkv.kernels.cpu.backend:NativeBackend",
}


def register(name: str, path: str) -> None:
    """Add backend ``name`` whose class ``"module:Class"`` loads on first request."""
    if name in _REGISTRY:
        raise ValueError(f"kernel backend {name!r} is already registered")
    _REGISTRY[name] = path


def backend_names() -> tuple[str, ...]:
    """The registered engine backends."""
    return tuple(_REGISTRY)


@functools.cache
def _instance(name: str) -> KernelBackend:
    module, _, cls_name = _REGISTRY[name].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    backend: KernelBackend = cls()
    return backend


def get_backend(name: str | None, device: torch.device) -> KernelBackend:
    """The backend ``name`` (None: ``$HYBRIDKV_KERNEL_BACKEND``, else by device) after
    checking it runs on ``device``; ``KernelBackendError`` (unknown name, or why it
    cannot run here) otherwise."""
    resolved = resolve_backend(name, device, allowed=backend_names())
    return _instance(resolved)
