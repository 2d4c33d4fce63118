"""``benchmarks/explain_divergence.py``: the first differing step and its near-tie test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from explain_divergence import TIE_ULPS, first_divergence, row, ulp


def _logits(rows: list[dict[int, float]]) -> torch.Tensor:
    out = torch.zeros(len(rows), 8)
    for i, r in enumerate(rows):
        for tok, v in r.items():
            out[i, tok] = v
    return out


def test_ulp_of_bf16_and_fp16():
    assert ulp(10.0, torch.bfloat16) == 2.0**-4  # 8 <= 10 < 16: 2^3 x 2^-7
    assert ulp(-0.75, torch.float16) == 2.0**-11


def test_identical_runs():
    d = first_divergence(
        [1, 2], _logits([{1: 5}, {2: 5}]), [1, 2], _logits([{1: 5}, {2: 5}]), torch.bfloat16
    )
    assert d.step is None and d.explained and "identical" in row(0, d)


def test_a_near_tie_is_explained_and_a_wide_gap_is_not():
    ours = _logits([{1: 5.0}, {3: 10.0625, 4: 10.0}])  # we prefer 3 by one bf16 ulp at 10
    theirs = _logits([{1: 5.0}, {3: 10.0, 4: 10.0625}])
    d = first_divergence([1, 3], ours, [1, 4], theirs, torch.bfloat16)
    assert (d.step, d.ours, d.theirs) == (1, 3, 4)
    assert d.our_margin == pytest.approx(0.0625) and d.their_margin == pytest.approx(0.0625)
    assert d.ulp == 2.0**-4 and d.explained and row(2, d).endswith("| yes |")
    wide = first_divergence(
        [1, 3], _logits([{1: 5.0}, {3: 12.0, 4: 10.0}]), [1, 4], theirs, torch.bfloat16
    )
    assert wide.our_margin == pytest.approx(2.0) and wide.our_margin > TIE_ULPS * wide.ulp
    assert not wide.explained and "NOT explained" in row(3, wide)


def test_runs_of_different_lengths_that_agree_are_an_error():
    with pytest.raises(ValueError, match="different lengths"):
        first_divergence([1], _logits([{1: 1}]), [1, 2], _logits([{1: 1}, {2: 1}]), torch.float16)
