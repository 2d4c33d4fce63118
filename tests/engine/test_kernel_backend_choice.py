"""How ``LLM`` picks its kernel backend (``engine_setup.resolve_kernel_backend``)."""

from __future__ import annotations

import pytest
import torch

from hybridkv.engine import engine_setup
from hybridkv.kernels import KernelBackendError

CPU = torch.device("cpu")


def test_cpu_default_is_native_where_it_builds(monkeypatch):
    monkeypatch.delenv("HYBRIDKV_KERNEL_BACKEND", raising=False)
    monkeypatch.setattr(engine_setup, "native_status", lambda: None)
    assert engine_setup.resolve_kernel_backend(None, CPU).name == "native"


def test_cpu_default_warns_when_native_cannot_build(monkeypatch):
    monkeypatch.delenv("HYBRIDKV_KERNEL_BACKEND", raising=False)
    monkeypatch.setattr(engine_setup, "native_status", lambda: "no C compiler")
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert engine_setup.resolve_kernel_backend(None, CPU).name == "torch"


def test_explicit_and_environment_choices(monkeypatch):
    monkeypatch.setenv("HYBRIDKV_KERNEL_BACKEND", "torch")
    assert engine_setup.resolve_kernel_backend(None, CPU).name == "torch"
    monkeypatch.delenv("HYBRIDKV_KERNEL_BACKEND")
    assert engine_setup.resolve_kernel_backend("torch", CPU).name == "torch"
    with pytest.raises(KernelBackendError, match="unknown backend"):
        engine_setup.resolve_kernel_backend("fast", CPU)
    with pytest.raises(KernelBackendError, match="CPU tensors only"):
        engine_setup.resolve_kernel_backend("native", torch.device("cuda"))
