"""``ssd_chunk_scan_fn`` (chunked SSD Triton kernels) against the fp64 oracle,
the torch reference and the sequential Triton kernel.

Chunks are 16 tokens here (the smallest ``tl.dot`` tile), so a few dozen
tokens cover every chunk edge: lengths 1, Q-1, Q, Q+1 and several chunks,
saves at chunk ends (state passing), inside chunks (the chunk scan), on a
sequence's first token, two in one chunk, into the sequence's own initial slot.
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
    mamba2_oracle,
    state_views,
    varlen_oracle,
)

from hybridkv.kernels.mamba import ssd_chunk_scan_fn, ssd_scan_fn
from hybridkv.kernels.mamba._common import chunk_layout

Q = 16
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # as test_mamba_ssm
KEYS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")


def _params(
    n: int, heads: int, head_dim: int, groups: int, d_state: int, dtype, softplus, full, seed
) -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g)

    rand = torch.rand((n, heads), generator=g) * 0.5 + 0.05
    dt = r(n, heads) * 0.5 - 1.0 if softplus else rand
    p = {
        "x": r(n, heads, head_dim),
        "dt": dt,
        "A": -torch.exp(r(heads) * 0.5),
        "B": r(n, groups, d_state),
        "C": r(n, groups, d_state),
        "D": r(heads) if full else None,
        "z": r(n, heads, head_dim) if full else None,
        "dt_bias": r(heads) * 0.1 if full else None,
    }
    return {k: v.to(dtype) if v is not None else None for k, v in p.items()}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.double(), want.double(), atol=TOL[dtype], rtol=TOL[dtype])


def _check_vs_oracle(p, softplus, sc, tail, chunk_size, index_dtype=torch.int64) -> None:
    sv = state_views(16, (3, 8), tail, seed=3)
    before = clone_views(sv)
    args = [p[k] for k in KEYS]
    out = ssd_chunk_scan_fn(
        *args, softplus, sv.ssm, *sc.tensors(index_dtype), chunk_size=chunk_size, backend="triton"
    )
    want, saves = varlen_oracle(
        lambda sl, h0: mamba2_oracle(
            *[
                p[k][sl] if k not in ("A", "D", "dt_bias") and p[k] is not None else p[k]
                for k in KEYS
            ],
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
    p = _params(sum(sc.lengths), 4, 6, 2, 5, torch.float32, softplus, full, seed=4)
    _check_vs_oracle(p, softplus, sc, (4, 6, 5), Q)


def test_odd_shapes_strided_inputs():
    """Two head_dim blocks (65 = 64 + 1), d_state 17, one group, chunk 32,
    non-contiguous x/dt/B/C, int32 indices."""
    sc = Scenario("odd", (33, 7), (4, -1), ((10, 4), (31, 5), (32, 6), (35, 7)))
    p = _params(40, 2, 65, 1, 17, torch.float32, True, True, seed=5)
    g = torch.Generator().manual_seed(6)
    for k, view in (
        ("x", lambda t: t[:, :, 1:66]),
        ("dt", lambda t: t[:, 1:3]),
        ("B", lambda t: t[:, :1, :17]),
        ("C", lambda t: t[:, 1:, 3:]),
    ):
        shape = {"x": (40, 2, 66), "dt": (40, 4), "B": (40, 2, 20), "C": (40, 2, 20)}[k]
        big = torch.randn(shape, generator=g)
        p[k] = view(big)
        assert not p[k].is_contiguous()
    _check_vs_oracle(p, True, sc, (2, 65, 17), 32, index_dtype=torch.int32)


@pytest.mark.parametrize(
    ("dtype", "state_dtype", "groups"),
    [
        (torch.float16, torch.float16, 4),
        (torch.bfloat16, torch.float32, 1),
        (torch.float32, torch.float32, 2),
    ],
)
def test_matches_sequential_and_reference(dtype, state_dtype, groups):
    """Half inputs (upcast inside) and states: chunked == sequential kernel == torch."""
    sc = CHUNK_SCENARIOS[0]
    p = _params(sum(sc.lengths), 4, 6, groups, 5, dtype, True, True, seed=7)
    args = [p[k] for k in KEYS]
    res = {}
    runs = {
        "torch": lambda st: ssd_scan_fn(*args, True, st, *sc.tensors(), backend="torch"),
        "sequential": lambda st: ssd_scan_fn(*args, True, st, *sc.tensors(), backend="triton"),
        "chunked": lambda st: ssd_chunk_scan_fn(
            *args, True, st, *sc.tensors(), chunk_size=Q, backend="triton"
        ),
    }
    for name, run in runs.items():
        sv = state_views(16, (3, 8), (4, 6, 5), ssm_dtype=state_dtype, seed=8)
        res[name] = (run(sv.ssm), sv.ssm)
    assert res["chunked"][0].dtype == dtype
    for other in ("torch", "sequential"):
        _close(res["chunked"][0], res[other][0], dtype)
        _close(res["chunked"][1], res[other][1], state_dtype)


def test_chunk_layout_worked_example():
    """Lengths 17, 0, 1, 32 in chunks of 16: chunks per sequence 2, 0, 1, 2."""
    qsl = torch.tensor([0, 17, 17, 18, 50], dtype=torch.int32)
    bounds, first = chunk_layout(qsl, 50, 16)
    assert first.tolist() == [0, 2, 2, 3, 5]
    # bound (50 + 4 * 15) // 16 = 6 chunks; the sixth is empty.
    assert bounds.tolist() == [[0, 16, 17, 18, 34, 0], [16, 17, 18, 34, 50, 0]]


@pytest.mark.parametrize("bad", [0, 8, 48, 16.0])
def test_bad_chunk_size(bad):
    sc = SCENARIOS[0]
    p = _params(5, 4, 6, 2, 5, torch.float32, True, True, seed=9)
    sv = state_views(8, (3, 8), (4, 6, 5))
    with pytest.raises(ValueError, match="chunk_size"):
        ssd_chunk_scan_fn(*[p[k] for k in KEYS], True, sv.ssm, *sc.tensors(), chunk_size=bad)


def test_bad_input_checked_like_ssd_scan():
    sc = SCENARIOS[0]
    p = _params(5, 4, 6, 2, 5, torch.float32, True, True, seed=9)
    p["C"] = p["C"][:, :1]  # n_groups of C != B's
    sv = state_views(8, (3, 8), (4, 6, 5))
    with pytest.raises(ValueError, match=r"^C: "):
        ssd_chunk_scan_fn(*[p[k] for k in KEYS], True, sv.ssm, *sc.tensors(), backend="torch")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("chunk", [64, 256])
def test_gpu_bamba_shapes_bf16(chunk):
    """32 heads x 64, 1 group, d_state 128, chunks of 64 (one block) and 256 (blocks of
    64, C B^T shared): chunked vs sequential vs torch."""
    dev = torch.device("cuda")
    lengths = (130, 1, 77, 256, 64)
    sc = Scenario(
        "gpu",
        lengths,
        (3, -1, 5, 9, -1),
        ((63, 3), (129, 10), (130, 11), (200, 5), (207, 12), (271, 13), (463, 9), (527, 14)),
    )
    p = _params(sum(lengths), 32, 64, 1, 128, torch.bfloat16, True, True, seed=10)
    args = [p[k].to(dev) if p[k] is not None else None for k in KEYS]
    idx = [t.to(dev) for t in sc.tensors()]
    res = {}
    for name in ("torch", "sequential", "chunked"):
        g = torch.Generator(device=dev).manual_seed(0)
        big = torch.randn((16, 32, 64, 136), generator=g, device=dev)
        state = big[..., :128]  # slot stride != prod(tail)
        if name == "chunked":
            out = ssd_chunk_scan_fn(*args, True, state, *idx, chunk_size=chunk, backend="triton")
        else:
            be = "torch" if name == "torch" else "triton"
            out = ssd_scan_fn(*args, True, state, *idx, backend=be)
        res[name] = (out, state)
    for name in ("sequential", "chunked"):
        for got, want in zip(res[name], res["torch"], strict=True):
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
