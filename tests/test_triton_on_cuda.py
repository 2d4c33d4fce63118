"""The Triton-on-CUDA test shim (``tests/triton_on_cuda.py``), checked on the CPU.

``call_on("cpu", ...)`` copies storages exactly as on a GPU machine, only to
other CPU memory, so everything but the device is checked here: the callee
sees copies (not the caller's memory) with the same views, views of one
buffer stay views of one buffer, in-place writes come back, results come back
as views of the caller's buffers where they are, and the backend checks and
implementation lookup are routed and restored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from triton_on_cuda import Shim, call_on, install

from hybridkv.kernels import backend as kernel_backend
from hybridkv.kernels.attention.metadata import AttentionMetadata, AttentionPlans
from hybridkv.kernels.cache_write import reshape_and_cache


@dataclass(frozen=True, slots=True)
class _Args:
    a: torch.Tensor
    b: torch.Tensor
    pair: tuple[torch.Tensor, int]
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    flag: bool = True


def test_the_callee_sees_copies_with_the_same_views_of_one_buffer():
    raw = torch.arange(24, dtype=torch.float32)
    a = raw[2:14].view(3, 4)[:, ::2]  # strided view
    b = raw.view(6, 4)[1:]  # another view of the same buffer
    seen = {}

    def fn(args: _Args) -> torch.Tensor:
        seen["ptr"] = args.a.untyped_storage().data_ptr()
        seen["same_buffer"] = args.a.untyped_storage().data_ptr() == (
            args.b.untyped_storage().data_ptr()
        )
        seen["geometry"] = (args.a.storage_offset(), args.a.size(), args.a.stride())
        args.a.mul_(-1)  # in place, through one view
        seen["through_b"] = args.b[0, 2].item()  # the other view sees it
        return args.b[1:3]

    args = _Args(a, b, (raw[:2], 7), {"k": raw[5:6]})
    out = call_on("cpu", fn, args)
    assert seen["ptr"] != raw.untyped_storage().data_ptr()
    assert seen["same_buffer"]
    assert seen["geometry"] == (a.storage_offset(), a.size(), a.stride())
    assert seen["through_b"] == -6.0  # raw[6] is a[1, 0]
    want = torch.arange(24, dtype=torch.float32)
    want[2:14].view(3, 4)[:, ::2].mul_(-1)
    assert torch.equal(raw, want)  # written back
    # The result is the same view of the caller's buffer.
    assert out.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
    assert torch.equal(out, want.view(6, 4)[2:4])


def test_new_results_come_back_and_arguments_are_not_mutated_when_not_written():
    x = torch.ones(3)

    def fn(t: torch.Tensor, *, scale: float) -> tuple[torch.Tensor, None]:
        return t * scale, None

    got, nothing = call_on("cpu", fn, x, scale=2.0)
    assert torch.equal(got, torch.full((3,), 2.0)) and nothing is None
    assert torch.equal(x, torch.ones(3))


def test_a_call_on_device_tensors_is_untouched_and_its_result_stays():
    # On the GPU, the GPU-only tests and the engine on CUDA pass device tensors: the
    # shim must not bring their results to the CPU (it did, and the Jamba engine's
    # next matmul met CPU activations and CUDA weights). Here "meta" plays the device.
    x = torch.empty(4, 3, device="meta")
    seen = {}

    def fn(t: torch.Tensor) -> torch.Tensor:
        seen["same"] = t is x
        return torch.empty(2, device="meta")

    out = call_on("cpu", fn, x)
    assert seen["same"]
    assert out.device.type == "meta"


def test_cached_plans_are_copied_not_shared():
    """A metadata's per-step plans built by the callee stay in its copy: the
    caller's metadata keeps plans on its own device only."""
    meta = AttentionMetadata.build([1], [3], torch.zeros((1, 2), dtype=torch.int32))
    meta.derived.decode["k"] = torch.zeros(2)  # type: ignore[index]

    def fn(m: AttentionMetadata) -> None:
        assert m is not meta and m.derived is not meta.derived
        assert isinstance(m.derived, AttentionPlans)
        m.derived.decode["new"] = torch.ones(1)  # type: ignore[index]

    call_on("cpu", fn, meta)
    assert set(meta.derived.decode) == {"k"}


def test_metadata_already_on_the_device_is_passed_itself():
    """The GPU lease's hot-path failures: a metadata whose tensors are all on the
    device reached the callee as a copy, so the plans the launcher cached in its
    ``derived`` were lost after each call and every layer planned again. Nothing is
    copied now, so the callee gets the caller's objects ("meta" plays the device)."""
    meta = AttentionMetadata.build([1], [3], torch.zeros((1, 2), dtype=torch.int32), device="meta")
    args = _Args(
        torch.empty(2, device="meta"),
        torch.empty(1, device="meta"),
        (torch.empty(1, device="meta"), 3),
    )

    def fn(m: AttentionMetadata, a: _Args) -> None:
        assert m is meta and m.derived is meta.derived and a is args
        m.derived.launches["plan"] = 1  # type: ignore[index]

    call_on("cpu", fn, meta, args)
    assert meta.derived.launches == {"plan": 1}


def test_install_routes_triton_calls_and_native_restores(monkeypatch):
    calls = []
    real = kernel_backend.Implementations.__getitem__

    def spy(impls, name):
        impl = real(impls, name)

        def run(*args, **kwargs):
            calls.append((name, args[2].untyped_storage().data_ptr()))
            return impl(*args, **kwargs)

        return run

    monkeypatch.setattr(kernel_backend.Implementations, "__getitem__", spy)
    monkeypatch.setattr(kernel_backend, "_CHECKS", dict(kernel_backend._CHECKS))
    shim: Shim = install("cpu")
    try:
        kc = torch.zeros(4, 2, 1, 3)
        vc = torch.zeros(4, 2, 1, 3)
        key, value = torch.ones(2, 1, 3), torch.full((2, 1, 3), 2.0)
        reshape_and_cache(key, value, kc, vc, torch.tensor([1, 6]), backend="triton")
        assert calls and calls[-1][0] == "triton"
        assert calls[-1][1] != kc.untyped_storage().data_ptr()  # ran on a copy
        assert torch.equal(kc[0, 1, 0], torch.ones(3)) and torch.equal(vc[3, 0, 0], value[1, 0])
        with shim.native():
            assert kernel_backend._CHECKS["triton"] is shim.original_checks["triton"]
            reshape_and_cache(key, value, kc, vc, torch.tensor([0, 2]), backend="triton")
            assert calls[-1][1] == kc.untyped_storage().data_ptr()  # no copy
        reshape_and_cache(key, value, kc, vc, torch.tensor([0, 2]), backend="torch")
        assert calls[-1][0] == "torch" and calls[-1][1] == kc.untyped_storage().data_ptr()
    finally:
        shim.off()
    assert kernel_backend.Implementations.__getitem__ is spy


def test_cuda_is_refused_here_when_absent():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises((RuntimeError, AssertionError)):
        call_on("cuda", lambda t: t, torch.ones(1))
