"""``research/decode_attention_bytes.py``: Gemma 3 270M's decode attention counted by
hand at 64 x 276 keys, and ``--measure``'s code path on the CPU's interpreter."""

from __future__ import annotations

import decode_attention_bytes as dab
import torch
from decode_attention_time import measure_lines

LEASE, SPAN_2048, FILL, FILL_TILE64, TILE64 = dab.VARIANTS
CTX = [276] * 64


def test_gemma_270m_geometry_as_the_engine_runs_it():
    geo = dab.gemma_270m()
    assert len(geo.windows) == 18 and geo.windows.count(512) == 15
    assert [i for i, w in enumerate(geo.windows) if w is None] == [5, 11, 17]
    assert (geo.heads, geo.kv_heads, geo.head, geo.block_size) == (4, 1, 256, 16)


def test_the_leases_launch_by_hand():
    # One program per sequence (its 4 query heads in 16 rows: K/V read once), q blocks
    # of 4 tokens numbered s // 4 + s: 64 // 4 + 64 = 80, 16 of them empty.
    w = dab.work(dab.gemma_270m(), LEASE, CTX, 512, 132)
    c = w.plan.choice
    assert (c.block_m, c.block_q, c.tile_n, c.num_warps, c.segments) == (16, 4, 32, 4, 1)
    assert w.plan.grid == (80, 1, 1) and (w.launched, w.busy) == (80, 64)
    assert w.max_tiles == 9  # 276 keys in tiles of 32
    assert w.kv_bytes == 64 * 276 * 256 * 2 * 2 == 18_087_936
    assert w.io_bytes == 2 * 64 * 4 * 256 * 2 and w.merge_bytes == 0
    assert w.resident == 2  # 196 registers x 128 threads: two programs an SM
    # The span class (2,048 or 416) plans the same launch at head 256: tiles of 32 at
    # any span, no split under 4,096 keys.
    assert dab.work(dab.gemma_270m(), SPAN_2048, CTX, 512, 132).plan == w.plan


def test_the_fill_rule_by_hand():
    w = dab.work(dab.gemma_270m(), FILL, CTX, None, 132)
    assert w.plan.choice.segments == 4  # 264 programs an H100/H200 holds // 64
    # 9 tiles in segments of 3: the fourth segment has none.
    assert (w.launched, w.busy, w.max_tiles) == (320, 192, 3)
    partials = 64 * 4 * 4 * (256 * 4 + 8)
    assert w.io_bytes == 64 * 4 * 256 * 2 + partials
    assert w.merge_bytes == partials + 64 * 4 * 256 * 2


def test_predictions_follow_the_chain_and_never_undercut_the_bytes():
    geo = dab.gemma_270m()
    w = dab.work(geo, FILL, CTX, 512, 132)
    floor, pred = dab.predict(w, geo, dab.H200)
    chain = dab.CHAIN
    assert pred == chain.fixed + 3 * chain.tile_32k + chain.merge
    assert floor == (w.kv_bytes + w.io_bytes + w.merge_bytes) / 4.8e12 < pred
    # The lease's step is the calibration point (not a prediction): 526.6 us.
    lease = sum(dab.step(geo, LEASE, [n] * 64, dab.H200)["pred"] for n in dab.LEASE_CONTEXTS)
    assert abs(lease / len(dab.LEASE_CONTEXTS) - dab.MEASURED_US) < 0.5
    # A machine with no latency left is bound by its bytes.
    fast = dab.Chain(fixed=0.0, tile_32k=0.0, tile_64k=0.0, merge=0.0)
    assert dab.predict(w, geo, dab.H200, fast) == (floor, floor)


def test_measure_runs_every_variant_and_they_agree_on_the_cpu():
    geo = dab.Geometry(windows=(8, None), heads=4, kv_heads=1, head=32, block_size=4)
    lines = measure_lines(geo, dab.VARIANTS, lambda v, ctx: 1.0, contexts=(21,), batch=3,
                          device=torch.device("cpu"))  # fmt: skip
    rows = [line for line in lines if line.startswith("| 3 x 21 |")]
    assert len(rows) == len(dab.VARIANTS)
    assert all(float(row.split("|")[-2]) < 1e-2 for row in rows), rows  # bf16 outputs
