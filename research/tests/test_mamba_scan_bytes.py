"""``research/mamba_scan_bytes.py``: the bytes and multiply-adds of each phase, worked
by hand for Bamba 9B's heads (128 x 64, one group, d_state 128) at 1 x 4,096."""

from __future__ import annotations

import mamba_scan_bytes as msb
import pytest

BAMBA = (128, 64, 1, 128)


def _phase(lay: msb.Layout, name: str, seqs: int = 1, length: int = 4096) -> msb.Phase:
    (ph,) = [p for p in msb.phases(BAMBA, seqs, length, lay) if p.name == name]
    return ph


def test_chunk_64_states_are_a_quarter_gigabyte_read_and_written_by_the_pass():
    # 64 chunks x 128 heads x 64 x 128 fp32 = 268,435,456 bytes, read and written.
    ph = _phase(msb.ours(64), "state passing")
    assert ph.bytes == 2 * 64 * 128 * 64 * 128 * 4 == 536_870_912
    assert ph.programs == 128 * 64 * 128 // 512 and ph.steps == 64
    assert _phase(msb.OURS_LEASE, "state passing").steps == 3 * 64  # three round trips
    # mamba-ssm: chunk 256 (16 chunks), fp32 in, bf16 out.
    assert _phase(msb.MAMBA_SSM, "state passing").bytes == 16 * 128 * 64 * 128 * (4 + 2)


def test_multiply_adds_by_hand():
    t, h, p, n = 4096, 128, 64, 128
    assert _phase(msb.ours(64), "chunk states").macs == t * h * p * n
    # C h0^T, the causal product in [64, 64] blocks ((Q + 64) / 2 columns per row),
    # and C B^T per head without the shared buffer (chunk 64) or per group (256).
    q64 = _phase(msb.ours(64), "chunk scan").macs
    assert q64 == t * h * p * n + t * 64 * h * p + t * 64 * h * n
    q256 = _phase(msb.ours(256), "chunk scan").macs
    assert q256 == t * h * p * n + t * 160 * h * p
    assert _phase(msb.ours(256), "C B^T per group").macs == t * 256 * n


def test_larger_chunks_lower_every_floor_and_the_reference_is_one():
    for seqs, length in msb.CASES:
        for shape in msb.MAMBA2_SHAPES.values():
            f = [
                msb.floor_total(shape, seqs, length, lay, msb.H100)
                for lay in (
                    msb.OURS_LEASE,
                    msb.ours(64),
                    msb.ours(128),
                    msb.ours(256),
                    msb.MAMBA_SSM,
                )
            ]
            assert f[0] >= f[1] > f[2] > f[3] > f[4], (shape, seqs, f)


def test_floor_is_the_slower_of_bytes_and_flops_plus_serial_latency():
    m = msb.Machine("toy", 1e12, {"tf32": 1e12, "bf16": 2e12}, 10, 1e-6)
    lay = msb.ours(64)  # tf32 x 3 passes
    assert msb.floor_seconds(msb.Phase("a", 2e9, 0, 1), lay, m) == pytest.approx(2e-3)
    assert msb.floor_seconds(msb.Phase("b", 1e6, 1e9, 1), lay, m) == pytest.approx(6e-3)
    assert msb.floor_seconds(msb.Phase("c", 1e6, 0, 1, steps=5), lay, m) == pytest.approx(6e-6)


def test_report_tables():
    lines = msb.report()
    totals = [r for r in lines if r.count("|") == 7 and "x |" in r]
    assert len(totals) == 2 * 2 * 5  # shapes x cases x layouts
    assert all(r.endswith("| 1.00x |") for r in totals if "mamba-ssm" in r)
