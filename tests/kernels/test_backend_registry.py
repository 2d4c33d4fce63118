"""The engine's kernel backends: every op implemented or declared, fallbacks visible."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

import pytest
import torch

from hybridkv.kernels import KernelBackend, KernelBackendError, backend_names, get_backend
from hybridkv.kernels.registry import OPS, register
from hybridkv.kernels.torch_backend import TorchBackend
from hybridkv.kernels.triton_backend import TritonBackend

CPU = torch.device("cpu")
Fallbacks = Mapping[str, type[KernelBackend]]


def test_the_registered_backends() -> None:
    assert backend_names() == ("torch", "triton", "native")
    torch_ops = get_backend("torch", CPU)
    assert torch_ops is get_backend("torch", CPU)  # one shared instance
    assert str(torch_ops) == "torch"
    assert all(torch_ops.runs(op) == "torch" for op in OPS)


def test_fallbacks_are_declared_and_described() -> None:
    triton_ops = TritonBackend()
    assert {op for op in OPS if triton_ops.runs(op) != "triton"} == {
        "rope_pairwise", "greedy"
    }  # fmt: skip
    logits = torch.tensor([[0.0, 2.0, 2.0], [3.0, 1.0, 0.0]])
    assert TritonBackend().greedy(logits).tolist() == [1, 0]
    table = triton_ops.describe()
    assert re.search(r"\ngreedy +torch \(fallback\)", table)  # columns padded to the widest op
    assert re.search(r"\nattention +triton", table)


def test_native_declares_its_llama_and_mamba_fallbacks() -> None:
    from hybridkv.kernels.cpu.backend import NativeBackend

    native = NativeBackend()
    assert [op for op in OPS if native.runs(op) != "native"] == [
        "rms_norm", "rope_pairwise", "causal_conv1d", "selective_scan", "ssd_scan"
    ]  # fmt: skip
    assert native.amx_linears and not TorchBackend.amx_linears
    assert "prefill rows: torch" in native.describe()


def test_an_op_is_implemented_or_declared_never_both() -> None:
    with pytest.raises(TypeError, match="both implements 'greedy'"):

        class Both(TorchBackend):
            name = "both"
            fallbacks: ClassVar[Fallbacks] = {"greedy": TorchBackend}

            def greedy(self, logits: torch.Tensor) -> torch.Tensor:
                return logits.argmax(-1)

    with pytest.raises(TypeError, match="'softmax' is not an op"):

        class Unknown(TorchBackend):
            name = "unknown"
            fallbacks: ClassVar[Fallbacks] = {"softmax": TorchBackend}

    with pytest.raises(TypeError, match="must name every op once"):

        class Missing(KernelBackend):
            name = "missing"


def test_unknown_and_unrunnable_backends_fail_with_the_reason(
    monkeypatch, native_triton_checks
) -> None:
    with pytest.raises(KernelBackendError, match="unknown backend"):
        get_backend("fast", CPU)
    with pytest.raises(KernelBackendError, match="offers only"):
        get_backend("mamba_ssm", CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelBackendError, match="TRITON_INTERPRET=1"):
        get_backend("triton", CPU)
    with pytest.raises(ValueError, match="already registered"):
        register("torch", "hybridkv.kernels.torch_backend:TorchBackend")
