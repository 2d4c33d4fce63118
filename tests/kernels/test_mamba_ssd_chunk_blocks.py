"""``ssd_chunk_scan_fn`` with its chunks cut in blocks (``ScanTiles.block_m``,
``block_k``) and its state pass in blocks of the flattened state (``pass_block``),
against the fp64 oracle.

Chunks of 64 (and 128) tokens in blocks of 16-32 rows and positions: saves on the
last row of one row block and the first of the next, two in one chunk in different
row blocks, at chunk ends (the state pass), on a sequence's first token and into
its own initial slot; sequences of 1, Q-1, Q, Q+1 and 2.3 Q tokens in one call.
head_dim 20 and d_state 20 in blocks of 16 (the second of each partial); the state
pass's 400 elements in blocks of 64 (the seventh partial).
"""

from __future__ import annotations

import pytest
import torch
from mamba_oracle import Scenario
from test_mamba_scan_tiles import TOL, _relative_errors
from test_mamba_ssd_chunked import KEYS, _params

from hybridkv.kernels.mamba._common import chunk_layout
from hybridkv.kernels.mamba.args import ScanArgs
from hybridkv.kernels.mamba.scan_tiles import ScanTiles
from hybridkv.kernels.mamba.ssd_chunk_scan_triton import _choices, shares_cb
from hybridkv.kernels.mamba.ssd_chunk_state_triton import chunk_dt

# Lengths 1, 63, 64, 65, 150: sequences start at tokens 0, 1, 64, 128, 193.
BLOCKED = Scenario(
    "blocked",
    (1, 63, 64, 65, 150),
    (3, -1, 5, -1, 2),
    (
        (0, 3),  # a 1-token sequence saves into its own initial slot
        (16, 6),  # row 15 of a chunk: the last of row block 0 (of 16)
        (17, 7),  # row 16: the first of row block 1
        (63, 4),  # the last token of a Q-1 chunk (the state pass)
        (104, 8),  # row 40 of an exact chunk
        (127, 5),  # its end, into its own initial slot
        (191, 9),  # the end of chunk 0 of a Q+1 sequence
        (192, 10),  # its 1-token second chunk
        (193, 11),  # a sequence's first token
        (274, 12),  # rows 17 and 50 of its chunk 1: two in one chunk, two row blocks
        (307, 13),
        (333, 14),  # row 12 of its partial chunk 2
        (342, 2),  # the final state into the initial slot
    ),
)
TAIL = (2, 20, 20)  # heads, head_dim, d_state


@pytest.mark.parametrize(
    "tiles",
    [
        ScanTiles(chunk_size=64, block_p=16, block_n=16, block_m=16, block_k=16),
        ScanTiles(chunk_size=64, block_p=16, block_n=16, block_m=32, block_k=16),
        ScanTiles(chunk_size=64, block_p=16, block_n=16, block_m=16, block_k=32),
        ScanTiles(chunk_size=64, block_m=16, block_k=16, shared_cb=True),
        ScanTiles(chunk_size=64, pass_block=64),
        ScanTiles(chunk_size=128, block_m=32, block_k=32, pass_block=128),  # C B^T shared
        ScanTiles(chunk_size=128, block_m=32, block_k=32, shared_cb=False),
        ScanTiles(chunk_size=64, block_m=16, block_k=16, precision="bf16"),
    ],
    ids=lambda t: t.describe(),
)
def test_blocked_chunks_match_oracle(tiles):
    p = _params(sum(BLOCKED.lengths), 2, 20, 1, 20, torch.float32, True, True, seed=21)
    ey, es = _relative_errors(p, TAIL, tiles, BLOCKED)
    tol = TOL[tiles.precision or "tf32x3"]
    assert ey < tol and es < tol, (ey, es)


def test_blocks_several_heads_per_group_and_groups():
    """4 heads in 2 groups: each row block reads its own group's B and C."""
    p = _params(sum(BLOCKED.lengths), 4, 16, 2, 16, torch.float32, True, True, seed=22)
    tiles = ScanTiles(chunk_size=64, block_m=16, block_k=16, pass_block=64)
    ey, es = _relative_errors(p, (4, 16, 16), tiles, BLOCKED)
    assert ey < TOL["tf32x3"] and es < TOL["tf32x3"], (ey, es)


def test_block_rules():
    """Rows and steps: the chunk up to 64 (cut to the chunk); the pass: 512 elements."""
    assert (
        _choices(ScanTiles(), 64, 64, 128).block_m,
        _choices(ScanTiles(), 64, 64, 128).block_k,
    ) == (64, 64)
    big = _choices(ScanTiles(), 256, 64, 128)
    assert (big.block_m, big.block_k, big.pass_block) == (64, 64, 512)
    small = _choices(ScanTiles(block_m=128, block_k=64), 32, 64, 128)
    assert (small.block_m, small.block_k) == (32, 32)
    assert big.opts == {"num_warps": 4}  # no tile over [64, 64] at chunk 256


def test_shared_cb_rule_above_chunk_64():
    assert shares_cb(ScanTiles(), 128) and not shares_cb(ScanTiles(), 64)
    assert not shares_cb(ScanTiles(shared_cb=False), 256)
    assert shares_cb(ScanTiles(shared_cb=True), 64)


@pytest.mark.parametrize(("softplus", "full"), [(True, True), (False, False)])
def test_phase_0_buffers_match_torch(softplus, full):
    """dt, its cumulative dA per chunk (0 and flat past a chunk's end, and in the
    bound's unused chunks), each chunk's log decay and its last token's save slot."""
    sc = BLOCKED
    p = _params(sum(sc.lengths), 2, 4, 1, 4, torch.float32, softplus, full, seed=23)
    a = ScanArgs(
        *[p[k] for k in KEYS[:6]], p["z"], p["dt_bias"], softplus, torch.zeros(16, 2, 4, 4),
        *sc.tensors(),
    )  # fmt: skip
    qsl, _, save = sc.tensors(torch.int64)
    bounds, _ = chunk_layout(qsl, int(qsl[-1]), 64)
    dts, cums, dA_sum, end_save = chunk_dt(a, bounds, 64)
    dt = p["dt"] + (p["dt_bias"] if full else 0.0)
    dt = torch.nn.functional.softplus(dt) if softplus else dt
    for c, (t0, t1) in enumerate(bounds.T.tolist()):
        want_dt = torch.zeros(64, 2)
        want_dt[: t1 - t0] = dt[t0:t1]
        want_cum = torch.cumsum(want_dt * p["A"], 0)
        torch.testing.assert_close(dts[c].T, want_dt, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cums[c].T, want_cum, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dA_sum[c], want_cum[-1], atol=1e-5, rtol=1e-5)
        assert end_save[c].item() == (save[t1 - 1].item() if t1 > t0 else -1)
