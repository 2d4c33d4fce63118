"""Optional dependencies (pip extras) and the error a missing one raises.

The core (specs, block pool, managers, coordinators, planner, layouts,
``hybridkv plan``) needs only pydantic, pyyaml and xxhash. Everything else
comes with an extra of ``pyproject.toml``::

    engine   torch, numpy, transformers, safetensors, tqdm, jinja2, triton (Linux):
             the CPU/GPU engine, its kernels, KV buffers, ``generate`` (``simulate``
             needs only the core: the scheduler on a cost model)
    plot     matplotlib: ``hybridkv plan --plot``, ``simulate --plot``
    serve    engine + fastapi, uvicorn, prometheus-client: ``hybridkv serve``
    events   pyzmq, msgspec: KV cache events
    cluster  serve + sglang-router, openai: replicas behind SGLang's gateway
    store    mooncake-transfer-engine-non-cuda: a Mooncake Store tier shared by replicas
             (its wheel needs Debian's ``libibverbs1``)
    demo     engine + gguf, accelerate and the Gemma 3 270M package: ``hybridkv demo``
    cpu      nothing to install, but a C compiler (``cc``) at run time: the native kernels
    mamba    einops (mamba-ssm itself: ``make mamba``); dev: the test and lint tools

Code at a boundary (an engine entry point, a plot, a kernel module) calls
``require(module, extra)`` before it needs the module; a missing module then
raises ``MissingExtraError`` whose message names the ``pip install`` to run.
It is a ``ValueError`` too, so each subcommand reports it as a one-line user
error (``hybridkv.common.user_errors``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = (
    "engine",
    "plot",
    "serve",
    "events",
    "demo",
    "cpu",
    "cluster",
    "store",
    "mamba",
    "dev",
)


class MissingExtraError(ImportError, ValueError):
    """A module of an optional extra is not installed; the message says what to install."""


def install_command(extra: str) -> str:
    """The pip command that installs ``extra``: ``pip install 'hybridkv[engine]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; extras are {EXTRAS}")
    return f"pip install 'hybridkv[{extra}]'"


def require(module: str, extra: str, purpose: str | None = None) -> ModuleType:
    """Import ``module`` (a dotted name), or raise ``MissingExtraError``.

    Only a missing ``module`` (or a missing parent package of it) becomes a
    ``MissingExtraError``; an import that fails for another reason (a broken
    install, a missing dependency of the module itself) propagates unchanged.
    ``purpose`` ("hybridkv generate") starts the message when given.
    """
    command = install_command(extra)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        parts = module.split(".")
        prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
        if e.name not in prefixes:
            raise
        who = f"{purpose} needs" if purpose else "this needs"
        raise MissingExtraError(
            f"{who} the '{extra}' extra ({e.name} is not installed): {command}",
            name=e.name,
        ) from None
