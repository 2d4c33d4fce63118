"""Bad arguments to the Mamba ops fail the same way on every backend, naming the argument."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
from mamba_oracle import state_views

from hybridkv.kernels.backend import KernelBackendError
from hybridkv.kernels.mamba import (
    causal_conv1d_fn,
    causal_conv1d_update,
    selective_chunk_scan_fn,
    selective_scan_fn,
    selective_state_update,
    ssd_chunk_scan_fn,
    ssd_scan_fn,
    ssd_state_update,
)

T, DIM, W = 5, 8, 4
D_INNER, D_STATE = 8, 4
HEADS, HEAD_DIM, GROUPS, N = 4, 2, 2, 4


def _conv_update(**kw) -> Callable[[], object]:
    sv = state_views(4, (W - 1, DIM), (2, 2), seed=0)
    a = {
        "x": torch.randn(2, DIM),
        "conv_state": sv.conv,
        "weight": torch.randn(DIM, W),
        "bias": torch.randn(DIM),
        "activation": "silu",
        "conv_state_indices": torch.tensor([1, 2]),
    }
    a.update(kw)
    return lambda: causal_conv1d_update(**a)


def _conv_fn(**kw) -> Callable[[], object]:
    sv = state_views(4, (W - 1, DIM), (2, 2), seed=0)
    a = {
        "x": torch.randn(T, DIM),
        "weight": torch.randn(DIM, W),
        "bias": None,
        "activation": None,
        "conv_state": sv.conv,
        "query_start_loc": torch.tensor([0, 2, T]),
        "initial_state_indices": torch.tensor([1, -1]),
        "save_state_indices": torch.tensor([-1, 1, -1, -1, 2]),
    }
    a.update(kw)
    return lambda: causal_conv1d_fn(**a)


def _m1(n: int) -> dict[str, object]:
    return {
        "x": torch.randn(n, D_INNER),
        "dt": torch.rand(n, D_INNER),
        "A": -torch.rand(D_INNER, D_STATE),
        "B": torch.randn(n, D_STATE),
        "C": torch.randn(n, D_STATE),
        "D": torch.randn(D_INNER),
        "z": None,
        "dt_bias": None,
        "dt_softplus": True,
    }


def _m2(n: int) -> dict[str, object]:
    return {
        "x": torch.randn(n, HEADS, HEAD_DIM),
        "dt": torch.rand(n, HEADS),
        "A": -torch.rand(HEADS),
        "B": torch.randn(n, GROUPS, N),
        "C": torch.randn(n, GROUPS, N),
        "D": None,
        "z": torch.randn(n, HEADS, HEAD_DIM),
        "dt_bias": torch.randn(HEADS),
        "dt_softplus": False,
    }


def _ssm_update(**kw) -> Callable[[], object]:
    a = {
        **_m1(2),
        "state": state_views(4, (1, 2), (D_INNER, D_STATE)).ssm,
        "state_indices": torch.tensor([1, 3]),
    }
    a.update(kw)
    return lambda: selective_state_update(**a)


def _ssd_update(**kw) -> Callable[[], object]:
    a = {
        **_m2(2),
        "state": state_views(4, (1, 2), (HEADS, HEAD_DIM, N)).ssm,
        "state_indices": torch.tensor([1, 3]),
    }
    a.update(kw)
    return lambda: ssd_state_update(**a)


def _scan_args() -> dict[str, object]:
    return {
        "query_start_loc": torch.tensor([0, 3, T]),
        "initial_state_indices": torch.tensor([1, 2]),
        "save_state_indices": torch.tensor([-1, -1, 1, -1, 2]),
    }


def _ssm_scan(op: Callable[..., object] = selective_scan_fn, **kw) -> Callable[[], object]:
    a = {**_m1(T), "ssm_state": state_views(4, (1, 2), (D_INNER, D_STATE)).ssm, **_scan_args()}
    a.update(kw)
    return lambda: op(**a)


def _ssd_scan(op: Callable[..., object] = ssd_scan_fn, **kw) -> Callable[[], object]:
    a = {**_m2(T), "ssm_state": state_views(4, (1, 2), (HEADS, HEAD_DIM, N)).ssm, **_scan_args()}
    a.update(kw)
    return lambda: op(**a)


def _strided_last(t: torch.Tensor) -> torch.Tensor:
    """Same shape, last-dimension stride 2."""
    return torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)[..., ::2]


BAD = [
    ("conv_update x ndim", _conv_update(x=torch.randn(2, DIM, 1)), "x"),
    ("conv_update weight dim", _conv_update(weight=torch.randn(DIM + 1, W)), "weight"),
    ("conv_update width 1", _conv_update(weight=torch.randn(DIM, 1)), "weight"),
    ("conv_update bias shape", _conv_update(bias=torch.randn(DIM + 1)), "bias"),
    ("conv_update state rows", _conv_update(conv_state=torch.zeros(4, W, DIM)), "conv_state"),
    ("conv_update state stride",
     _conv_update(conv_state=_strided_last(torch.zeros(4, W - 1, DIM))), "conv_state"),
    ("conv_update state dtype",
     _conv_update(conv_state=torch.zeros(4, W - 1, DIM, dtype=torch.int32)), "conv_state"),
    ("conv_update x dtype", _conv_update(x=torch.zeros(2, DIM, dtype=torch.float64)), "x"),
    ("conv_update index dtype",
     _conv_update(conv_state_indices=torch.tensor([1.0, 2.0])), "conv_state_indices"),
    ("conv_update index len",
     _conv_update(conv_state_indices=torch.tensor([1])), "conv_state_indices"),
    ("conv_update activation", _conv_update(activation="relu"), "activation"),
    ("conv_update device", _conv_update(weight=torch.randn(DIM, W, device="meta")), "weight"),
    ("conv_fn x stride", _conv_fn(x=_strided_last(torch.zeros(T, DIM))), "x"),
    ("conv_fn qsl dtype",
     _conv_fn(query_start_loc=torch.tensor([0.0, 2.0, 5.0])), "query_start_loc"),
    ("conv_fn qsl values", _conv_fn(query_start_loc=torch.tensor([0, 2, T + 1])),
     "query_start_loc"),
    ("conv_fn qsl falling", _conv_fn(query_start_loc=torch.tensor([0, 4, 3, T]),
                                     initial_state_indices=torch.tensor([1, 2, 3])),
     "query_start_loc"),
    ("conv_fn init len",
     _conv_fn(initial_state_indices=torch.tensor([1, 2, 3])), "initial_state_indices"),
    ("conv_fn save len",
     _conv_fn(save_state_indices=torch.tensor([-1, 1])), "save_state_indices"),
    ("conv_fn state device",
     _conv_fn(conv_state=torch.zeros(4, W - 1, DIM, device="meta")), "conv_state"),
    ("ssm_update A shape", _ssm_update(A=torch.randn(D_INNER + 1, D_STATE)), "A"),
    ("ssm_update state shape",
     _ssm_update(state=torch.zeros(4, D_INNER, D_STATE + 1)), "state"),
    ("ssm_update B shape", _ssm_update(B=torch.randn(2, D_STATE + 1)), "B"),
    ("ssm_update z shape", _ssm_update(z=torch.randn(3, D_INNER)), "z"),
    ("ssm_update indices len", _ssm_update(state_indices=torch.tensor([1])), "state_indices"),
    ("ssd_update groups", _ssd_update(B=torch.randn(2, 3, N), C=torch.randn(2, 3, N)), "B"),
    ("ssd_update dt shape", _ssd_update(dt=torch.rand(2, HEADS, HEAD_DIM)), "dt"),
    ("ssd_update A shape", _ssd_update(A=torch.rand(HEADS, HEAD_DIM, N)), "A"),
    ("ssd_update D shape", _ssd_update(D=torch.rand(HEADS, HEAD_DIM)), "D"),
    ("ssd_update state stride",
     _ssd_update(state=_strided_last(torch.zeros(4, HEADS, HEAD_DIM, N))), "state"),
    ("ssm_scan state shape",
     _ssm_scan(ssm_state=torch.zeros(4, D_STATE, D_INNER)), "ssm_state"),
    ("ssm_scan dt len", _ssm_scan(dt=torch.rand(T - 1, D_INNER)), "dt"),
    ("ssm_scan save dtype",
     _ssm_scan(save_state_indices=torch.zeros(T, dtype=torch.int16)), "save_state_indices"),
    ("ssd_scan C shape", _ssd_scan(C=torch.randn(T, GROUPS, N + 1)), "C"),
    ("ssd_scan qsl ndim",
     _ssd_scan(query_start_loc=torch.tensor([[0, 3, T]])), "query_start_loc"),
    ("ssd_scan init len",
     _ssd_scan(initial_state_indices=torch.tensor([1])), "initial_state_indices"),
    ("ssm_chunk_scan dt len", _ssm_scan(selective_chunk_scan_fn, dt=torch.rand(T, 1)), "dt"),
    ("ssm_chunk_scan chunk", _ssm_scan(selective_chunk_scan_fn, chunk_size=3), "chunk_size"),
    ("ssd_chunk_scan C shape",
     _ssd_scan(ssd_chunk_scan_fn, C=torch.randn(T, GROUPS, N + 1)), "C"),
    ("ssd_chunk_scan save len",
     _ssd_scan(ssd_chunk_scan_fn, save_state_indices=torch.tensor([-1])), "save_state_indices"),
    ("ssd_chunk_scan chunk", _ssd_scan(ssd_chunk_scan_fn, chunk_size=8), "chunk_size"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "arg"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_argument_names_it(call, arg):
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        call()


@pytest.mark.parametrize(
    ("make", "backend"),
    [
        (_conv_update, "cuda"),
        (_conv_fn, "mamba_ssm"),
        (_ssm_scan, "mamba_ssm"),
        (_ssm_update, "nope"),
        (_ssd_scan, "flash"),
        (partial(_ssm_scan, selective_chunk_scan_fn), "mamba_ssm"),
        (partial(_ssd_scan, ssd_chunk_scan_fn), "mamba_ssm"),
    ],
)
def test_unknown_or_unoffered_backend(make, backend):
    with pytest.raises(KernelBackendError):
        make(backend=backend)()


def test_triton_without_interpreter(monkeypatch, native_triton_checks):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelBackendError, match="TRITON_INTERPRET"):
        _ssd_update(backend="triton")()
