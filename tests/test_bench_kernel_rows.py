"""``benchmarks/kernel_attention_gpu.py``'s rows at tiny shapes on the CPU (Triton's
interpreter), so that the GPU-only benchmark code keeps running: each row has
its columns and finite, positive figures."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_attention_gpu as rows  # noqa: E402

CPU = torch.device("cpu")
TINY = (4, 2, 16, 4)  # 4 query heads over 2 KV heads of 16, block 4
NUMBER = re.compile(r"^[\d,.]+(x|%)?$")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real ones")


@pytest.fixture(autouse=True)
def _one_call(monkeypatch):
    monkeypatch.setattr(rows, "REPS", 1)
    monkeypatch.setattr(rows, "WARMUP", 0)


def _cells(row: str, n: int) -> list[str]:
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == n, row
    return cells


def test_decode_grid_leaves_out_what_does_not_fit():
    out = rows.decode_rows(
        CPU, 1e9, False, contexts=(8, 40), batches=(1, 3), max_tokens=100, geometry=TINY
    )
    # 3 kinds x (1x8, 1x40, 3x8); 3 x 40 > 100 tokens is left out
    assert len(out) == 9
    for r in out:
        cells = _cells(r, 10)
        assert all(NUMBER.match(c) for c in cells[1:6] + cells[8:]), r
        assert cells[6:8] == ["n/a (no CUDA graphs on the CPU)", ""], r  # the graph's columns
    shapes = {(_cells(r, 10)[1], _cells(r, 10)[2]) for r in out}
    assert shapes == {("1", "8"), ("1", "40"), ("3", "8")}


def test_prefill_mixed_and_cache_write_rows():
    pre = rows.prefill_rows(CPU, False, cases=((1, 12), (2, 7)), geometry=TINY)
    assert len(pre) == 6 and all(_cells(r, 5)[4].endswith("x") for r in pre)
    mixed = rows.mixed_rows(CPU, False, cases=((6, 9, 2, 20),), geometry=TINY)
    assert len(mixed) == 1 and _cells(mixed[0], 4)[0] == "6 on 9 + 2 x 20"
    cw = rows.cache_write_rows(CPU, 1e9, True, tokens=(8, 24, 64), geometry=TINY)
    assert [_cells(r, 4)[0] for r in cw] == ["8", "24"]  # quick: the first two
    assert all(_cells(r, 4)[3].endswith("%") for r in cw)


def test_call_cost_rows():
    # Where a small call's time goes: alone, back to back, host only, host until done,
    # the metadata build and the first call on new metadata; then reshape_and_cache.
    out = rows.call_cost_rows(
        CPU, False, cases=(("sliding 1024", 2, 12),), write_tokens=8, geometry=TINY
    )
    assert len(out) == 2
    cells = _cells(out[0], 7)
    assert cells[0] == "decode sliding 1024 2 x 12"
    assert all(NUMBER.match(c) and float(c.replace(",", "")) > 0 for c in cells[1:]), out[0]
    cw = _cells(out[1], 7)
    assert cw[0] == "reshape_and_cache 8 tokens" and cw[5:] == ["n/a", "n/a"]
    assert all(NUMBER.match(c) for c in cw[1:5]), out[1]
