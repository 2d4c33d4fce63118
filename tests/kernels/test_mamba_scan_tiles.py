"""``ScanTiles``: its validation, and ``ssd_chunk_scan_fn(tiles=...)`` against the
fp64 oracle for every block split and dot precision.

Tolerances are per precision, as a fraction of the largest expected value
(outputs and states each): IEEE fp32 and tf32x3 (three tf32 products, about
fp32 accuracy) 1e-5, like the fp32 tests; tf32 (10-bit mantissa, unit roundoff
2^-11) 1e-2; bf16 (8-bit significand, unit roundoff 2^-8 ~ 4e-3 per operand,
about 1e-2 measured here) 5e-2. Under Triton's interpreter ``tf32`` and ``tf32x3``
run as plain fp32 (its ``tl.dot`` ignores ``input_precision``), so here those
cases check the plumbing only; they test the tf32 rounding where the suite runs
compiled on a GPU (``tests/triton_on_cuda.py``). ``bf16`` rounds its operands
under the interpreter too (``ScanTiles``' docstring), so its case checks the
rounding everywhere, and that it happened.

``shared_cb`` (``C B^T`` once per (chunk, group) in a kernel of its own) is checked
against the in-kernel product (the same sums: 1e-6) and the oracle, with several
heads per group and several groups.
"""

from __future__ import annotations

import os

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
from test_mamba_ssd_chunked import KEYS, _params

from hybridkv.kernels.mamba import ssd_chunk_scan_fn
from hybridkv.kernels.mamba._common import chunk_layout
from hybridkv.kernels.mamba.scan_tiles import PRECISIONS, ScanTiles

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

TOL = {"ieee": 1e-5, "tf32x3": 1e-5, "tf32": 1e-2, "bf16": 5e-2}


def _relative_errors(
    p: dict, tail: tuple[int, int, int], tiles: ScanTiles, sc: Scenario = CHUNK_SCENARIOS[0]
) -> tuple[float, float]:
    """Max |error| / max |expected| of the outputs and of the saved states (by default
    scenario ``chunk_edges``: saves at chunk ends and inside chunks), after checking
    that nothing outside the saved slots changed."""
    sv = state_views(16, (3, 8), tail, seed=3)
    before = clone_views(sv)
    out = ssd_chunk_scan_fn(
        *[p[k] for k in KEYS], True, sv.ssm, *sc.tensors(), backend="triton", tiles=tiles
    )
    per_token = ("x", "dt", "B", "C", "z")
    want, saves = varlen_oracle(
        lambda sl, h0: mamba2_oracle(
            *[p[k][sl] if k in per_token else p[k] for k in KEYS], True, h0
        ),
        before.ssm,
        sc.qsl,
        list(sc.init),
        sc.save_idx,
    )
    assert saves.keys() == sc.written
    assert_only_slots_changed(before, sv, "ssm", sc.written)
    ey = ((out.double() - want).abs().max() / want.abs().max()).item()
    es = max(
        ((sv.ssm[slot].double() - st).abs().max() / st.abs().max()).item()
        for slot, st in saves.items()
    )
    return ey, es


def test_blocks_split_head_dim_and_d_state():
    """head_dim 20 and d_state 20 in blocks of 16 (two each, the second partial):
    the chunk-state and state-passing grids over both, the chunk scan's loop over
    d_state, saves inside chunks written block by block."""
    p = _params(sum(CHUNK_SCENARIOS[0].lengths), 2, 20, 1, 20, torch.float32, True, True, seed=11)
    tiles = ScanTiles(chunk_size=16, block_p=16, block_n=16, num_warps=2, num_stages=1)
    ey, es = _relative_errors(p, (2, 20, 20), tiles)
    assert ey < TOL["ieee"] and es < TOL["ieee"], (ey, es)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_precision_matches_oracle(precision):
    p = _params(sum(CHUNK_SCENARIOS[0].lengths), 2, 16, 2, 16, torch.float32, True, True, seed=12)
    ey, es = _relative_errors(p, (2, 16, 16), ScanTiles(chunk_size=16, precision=precision))
    assert ey < TOL[precision] and es < TOL[precision], (ey, es)
    if precision == "bf16":  # the operands were rounded (fp32 products give ~1e-7)
        assert max(ey, es) > 1e-4, (ey, es)


def _outputs(p: dict, tail: tuple[int, int, int], tiles: ScanTiles):
    """``(out, ssm states)`` of the ``chunk_edges`` scenario, from the same states."""
    sc = CHUNK_SCENARIOS[0]
    sv = state_views(16, (3, 8), tail, seed=3)
    out = ssd_chunk_scan_fn(
        *[p[k] for k in KEYS], True, sv.ssm, *sc.tensors(), backend="triton", tiles=tiles
    )
    return out, sv.ssm


@pytest.mark.parametrize(("precision", "block_n"), [("ieee", 16), ("ieee", None), ("bf16", 16)])
def test_shared_cb_matches_in_kernel_product_and_oracle(precision, block_n):
    """4 heads in 2 groups (2 per group), d_state 20 (in blocks of 16 where block_n is
    16, the second partial), chunks of 16 over sequences of 1, 15, 16, 17 and 40
    tokens with initial states and saves at and inside chunk ends."""
    p = _params(sum(CHUNK_SCENARIOS[0].lengths), 4, 16, 2, 20, torch.float32, True, True, 13)
    tail = (4, 16, 20)
    inside = ScanTiles(chunk_size=16, block_p=16, block_n=block_n, precision=precision)
    shared = ScanTiles(chunk_size=16, block_p=16, block_n=block_n, precision=precision,
                       shared_cb=True)  # fmt: skip
    want_y, want_st = _outputs(p, tail, inside)
    got_y, got_st = _outputs(p, tail, shared)
    torch.testing.assert_close(got_y, want_y, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_st, want_st, atol=1e-6, rtol=1e-6)
    ey, es = _relative_errors(p, tail, shared)
    assert ey < TOL[precision] and es < TOL[precision], (ey, es)


@pytest.mark.parametrize("q", [16, 128])
def test_shared_cb_kernel_zero_past_chunk_ends(q):
    """The buffer itself: C B^T per (chunk, group) over the chunk's tokens, 0 in the
    rows and columns past its end and in the unused chunks of the bound; chunk 128 in
    tiles of 64 (a 102-token chunk: one full tile and three partial ones)."""
    from hybridkv.kernels.mamba.ssd_chunk_scan_triton import _shared_cb

    g = torch.Generator().manual_seed(14)
    B, C = torch.randn((2, 120, 3, 20), generator=g)
    qsl = torch.tensor([0, 17, 18, 120], dtype=torch.int32)
    bounds, _ = chunk_layout(qsl, 120, q)
    # A private launcher, outside the backend table the CUDA test shim routes: on a GPU
    # machine its tensors go to the GPU here, as the chunk scan's do.
    dev = torch.device("cuda" if torch.cuda.is_available() and not INTERPRET else "cpu")
    cb = _shared_cb(B.to(dev), C.to(dev), bounds.to(dev), q, 16, "ieee", {"num_warps": 4})
    cb = cb.cpu()
    assert cb.shape == (bounds.shape[1], 3, q, q) and cb.dtype == torch.float32
    for c, (t0, t1) in enumerate(bounds.T.tolist()):
        want = torch.zeros(3, q, q)
        n = t1 - t0
        want[:, :n, :n] = torch.einsum("igd,jgd->gij", C[t0:t1].double(), B[t0:t1].double())
        torch.testing.assert_close(cb[c].double(), want.double(), atol=1e-5, rtol=1e-5)


def test_shared_cb_is_what_the_chunk_scan_reads(monkeypatch):
    """With ``shared_cb`` the chunk-scan kernel uses the buffer, not its own product
    (a buffer of zeros changes the outputs); without it no buffer is made."""
    from hybridkv.kernels.mamba import ssd_chunk_scan_triton as mod

    calls = []

    def zeros(*args, **kwargs):
        calls.append(args[3])
        return torch.zeros_like(mod_shared(*args, **kwargs))

    mod_shared = mod._shared_cb
    want = _run(tiles=ScanTiles(shared_cb=True))
    monkeypatch.setattr(mod, "_shared_cb", zeros)
    got = _run(tiles=ScanTiles(shared_cb=True))
    assert len(calls) == 1 and not torch.allclose(got, want)
    inside = _run(tiles=ScanTiles(shared_cb=False))  # no buffer: the kernel's own product
    assert len(calls) == 1
    torch.testing.assert_close(inside, want, atol=1e-6, rtol=1e-6)


def _run(tiles=None, chunk_size=None, backend="triton"):
    sc = SCENARIOS[0]
    p = _params(5, 4, 6, 2, 5, torch.float32, True, True, seed=9)
    sv = state_views(8, (3, 8), (4, 6, 5))
    return ssd_chunk_scan_fn(
        *[p[k] for k in KEYS], True, sv.ssm, *sc.tensors(),
        chunk_size=chunk_size, backend=backend, tiles=tiles,
    )  # fmt: skip


def test_chunk_size_from_tiles_or_argument_not_both():
    a = _run(tiles=ScanTiles(chunk_size=32))
    b = _run(chunk_size=32)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="chunk_size: given twice"):
        _run(tiles=ScanTiles(chunk_size=32), chunk_size=16)


def test_torch_backend_ignores_tiles():
    want = _run(backend="torch")
    got = _run(tiles=ScanTiles(block_p=16, block_n=32, precision="bf16"), backend="torch")
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_tiles_must_be_scan_tiles():
    with pytest.raises(TypeError, match="tiles: must be a ScanTiles"):
        _run(tiles={"chunk_size": 32})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk_size": 8}, r"chunk_size: must be in \[16, 256\]"),
        ({"chunk_size": 512}, r"chunk_size: must be in \[16, 256\]"),
        ({"chunk_size": 48}, "chunk_size: must be a power of two"),
        ({"block_p": 8}, r"block_p: must be in \[16, 128\]"),
        ({"block_n": 24}, "block_n: must be a power of two"),
        ({"block_n": True}, "block_n: must be a power of two"),
        ({"block_m": 8}, r"block_m: must be in \[16, 256\]"),
        ({"block_k": 96}, "block_k: must be a power of two"),
        ({"pass_block": 32}, r"pass_block: must be in \[64, 4096\]"),
        ({"num_warps": 32}, r"num_warps: must be in \[1, 16\]"),
        ({"num_stages": 0}, r"num_stages: must be an integer in \[1, 8\]"),
        ({"num_stages": 2.0}, r"num_stages: must be an integer in \[1, 8\]"),
        ({"precision": "fp16"}, "precision: must be one of"),
        ({"shared_cb": 1}, "shared_cb: must be True, False or None"),
        ({"shared_cb": "yes"}, "shared_cb: must be True, False or None"),
    ],
)
def test_scan_tiles_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScanTiles(**kwargs)


def test_describe_names_the_fields_set():
    assert ScanTiles().describe() == "defaults"
    tiles = ScanTiles(chunk_size=128, precision="tf32")
    assert tiles.describe() == "chunk_size=128, precision=tf32"
    assert ScanTiles(chunk_size=64, shared_cb=True).describe() == "chunk_size=64, shared_cb=True"
