"""``selective_chunk_scan_fn`` (Mamba1, parallel within chunks) against the fp64
oracle, the torch reference and the sequential Triton kernel.

Chunks are 16 tokens (8 and 2 in one test), so a few dozen tokens cover every
chunk edge and every kind of save (``mamba_oracle.CHUNK_SCENARIOS``).
"""

from __future__ import annotations

import pytest
import torch
from mamba_oracle import (
    CHUNK_SCENARIOS,
    SCENARIOS,
    Scenario,
    assert_only_slots_changed,
    clone_views,
    mamba1_oracle,
    state_views,
    varlen_oracle,
)

from hybridkv.kernels.mamba import (
    selective_chunk_scan_fn,
    selective_scan_fn,
    ssm_chunk_scan_triton,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # as test_mamba_ssm
KEYS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")
PER_TOKEN = ("x", "dt", "B", "C", "z")


def _params(n: int, d_inner: int, d_state: int, dtype, softplus, full, seed) -> dict:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g)

    rand = torch.rand((n, d_inner), generator=g) * 0.5 + 0.05
    p = {
        "x": r(n, d_inner),
        "dt": r(n, d_inner) * 0.5 - 1.0 if softplus else rand,
        "A": -torch.exp(r(d_inner, d_state) * 0.5),
        "B": r(n, d_state),
        "C": r(n, d_state),
        "D": r(d_inner) if full else None,
        "z": r(n, d_inner) if full else None,
        "dt_bias": r(d_inner) * 0.1 if full else None,
    }
    return {k: v.to(dtype) if v is not None else None for k, v in p.items()}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.double(), want.double(), atol=TOL[dtype], rtol=TOL[dtype])


def _check_vs_oracle(p, softplus, sc, chunk_size, index_dtype=torch.int64) -> None:
    tail = tuple(p["A"].shape)
    sv = state_views(16, (3, 8), tail, seed=3)
    before = clone_views(sv)
    args = [p[k] for k in KEYS]
    out = selective_chunk_scan_fn(
        *args, softplus, sv.ssm, *sc.tensors(index_dtype), chunk_size=chunk_size, backend="triton"
    )
    want, saves = varlen_oracle(
        lambda sl, h0: mamba1_oracle(
            *[p[k][sl] if k in PER_TOKEN and p[k] is not None else p[k] for k in KEYS],
            softplus,
            h0,
        ),
        before.ssm,
        sc.qsl,
        list(sc.init),
        sc.save_idx,
    )
    assert out.dtype == p["x"].dtype
    _close(out, want, torch.float32)
    assert saves.keys() == sc.written
    for slot, st in saves.items():
        _close(sv.ssm[slot], st, torch.float32)
    assert_only_slots_changed(before, sv, "ssm", sc.written)


@pytest.mark.parametrize("sc", SCENARIOS + CHUNK_SCENARIOS, ids=lambda s: s.name)
@pytest.mark.parametrize(("softplus", "full"), [(True, True), (False, False)])
def test_matches_oracle(sc, softplus, full):
    """Outputs, every checkpoint and no other byte of the state buffer, fp32."""
    p = _params(sum(sc.lengths), 12, 6, torch.float32, softplus, full, seed=4)
    _check_vs_oracle(p, softplus, sc, 16)


@pytest.mark.parametrize("chunk_size", [2, 8])
def test_short_chunks(chunk_size):
    """Many chunks per sequence: saves land on every position within a chunk."""
    sc = CHUNK_SCENARIOS[1]
    p = _params(sum(sc.lengths), 12, 6, torch.float32, True, True, seed=5)
    _check_vs_oracle(p, True, sc, chunk_size)


def test_odd_shapes_strided_inputs(monkeypatch):
    """d_state 9, d_inner 18 in channel blocks of 4 (the last one partial; a
    smaller register budget than on GPUs keeps the interpreter's per-element
    associative scan fast), non-contiguous x/dt/B/C, int32 indices."""
    monkeypatch.setattr(ssm_chunk_scan_triton, "_BLOCK_ELEMS", 1024)  # the launcher's tiles
    sc = Scenario("odd", (17, 3), (4, -1), ((5, 4), (15, 5), (16, 6), (19, 7)))
    p = _params(20, 18, 9, torch.float32, True, True, seed=6)
    g = torch.Generator().manual_seed(7)
    p["x"] = torch.randn(20, 21, generator=g)[:, 3:]
    p["dt"] = (torch.randn(20, 19, generator=g) * 0.5 - 1.0)[:, 1:]
    p["B"] = torch.randn(20, 12, generator=g)[:, :9]
    p["C"] = torch.randn(20, 12, generator=g)[:, 3:]
    assert not any(p[k].is_contiguous() for k in ("x", "dt", "B", "C"))
    _check_vs_oracle(p, True, sc, 16, index_dtype=torch.int32)


@pytest.mark.parametrize(
    ("dtype", "state_dtype"),
    [(torch.float16, torch.float16), (torch.bfloat16, torch.float32)],
)
def test_matches_sequential_and_reference(dtype, state_dtype):
    """Half inputs (upcast inside) and states: chunked == sequential kernel == torch."""
    sc = CHUNK_SCENARIOS[0]
    p = _params(sum(sc.lengths), 12, 6, dtype, True, True, seed=8)
    args = [p[k] for k in KEYS]
    idx = sc.tensors()
    runs = {
        "torch": lambda st: selective_scan_fn(*args, True, st, *idx, backend="torch"),
        "sequential": lambda st: selective_scan_fn(*args, True, st, *idx, backend="triton"),
        "chunked": lambda st: selective_chunk_scan_fn(
            *args, True, st, *idx, chunk_size=16, backend="triton"
        ),
    }
    res = {}
    for name, run in runs.items():
        sv = state_views(16, (3, 8), (12, 6), ssm_dtype=state_dtype, seed=9)
        res[name] = (run(sv.ssm), sv.ssm)
    assert res["chunked"][0].dtype == dtype
    for other in ("torch", "sequential"):
        _close(res["chunked"][0], res[other][0], dtype)
        _close(res["chunked"][1], res[other][1], state_dtype)


@pytest.mark.parametrize("bad", [0, 1, 12, 16.0])
def test_bad_chunk_size(bad):
    sc = SCENARIOS[0]
    p = _params(5, 12, 6, torch.float32, True, True, seed=9)
    sv = state_views(8, (3, 8), (12, 6))
    with pytest.raises(ValueError, match="chunk_size"):
        selective_chunk_scan_fn(*[p[k] for k in KEYS], True, sv.ssm, *sc.tensors(), chunk_size=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_jamba_shapes_bf16():
    """d_inner 8192, d_state 16 (Jamba), default chunk: chunked vs sequential vs torch."""
    dev = torch.device("cuda")
    lengths = (130, 1, 77, 256, 64)
    sc = Scenario(
        "gpu",
        lengths,
        (3, -1, 5, 9, -1),
        ((63, 3), (129, 10), (130, 11), (200, 5), (207, 12), (271, 13), (463, 9), (527, 14)),
    )
    p = _params(sum(lengths), 8192, 16, torch.bfloat16, True, True, seed=10)
    args = [p[k].to(dev) if p[k] is not None else None for k in KEYS]
    idx = [t.to(dev) for t in sc.tensors()]
    res = {}
    for name in ("torch", "sequential", "chunked"):
        g = torch.Generator(device=dev).manual_seed(0)
        state = torch.randn((16, 8192, 24), generator=g, device=dev)[..., :16]
        if name == "chunked":
            out = selective_chunk_scan_fn(*args, True, state, *idx, backend="triton")
        else:
            be = "torch" if name == "torch" else "triton"
            out = selective_scan_fn(*args, True, state, *idx, backend=be)
        res[name] = (out, state)
    for name in ("sequential", "chunked"):
        for got, want in zip(res[name], res["torch"], strict=True):
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
