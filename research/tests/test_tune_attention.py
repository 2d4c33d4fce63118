"""``research/tune_attention.py`` at a tiny shape on the CPU (Triton's interpreter), so
that the GPU-only launch sweep keeps running."""

from __future__ import annotations

import pytest
import torch
import tune_attention as tune

CPU = torch.device("cpu")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real sweep")


def test_tuning_sweep_times_every_candidate_against_the_defaults():
    shape = tune.shapes(quick=False, tiny=True)[0]  # decodes: tiles, stages, then split-KV
    (row,) = tune.sweep_shape(shape, CPU, tiny=True, reps=1)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 7, row
    assert cells[0] == shape.name and cells[5] == "7" and cells[6] == "0"
    assert cells[4].endswith("x")


def test_batches_with_prefill_rows_also_try_longest_first_and_a_split():
    shape = tune.shapes(quick=False, tiny=True)[1]  # prefill 1 x 24
    (row,) = tune.sweep_shape(shape, CPU, tiny=True, reps=1)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # defaults, 4 tile candidates, 2 stage counts, longest first, split 2: 9, none refused.
    assert cells[0] == shape.name and cells[5] == "9" and cells[6] == "0", row
