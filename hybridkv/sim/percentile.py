"""Percentiles of the replay's figures without numpy (``hybridkv simulate`` runs on the core).

``percentiles(values, qs)`` is numpy's default (``method="linear"``): for each
``q``, the value at rank ``(n - 1) * q / 100`` of the sorted values,
interpolated between the two ranks around it with numpy's rounding (from the
lower value below the midpoint, from the upper one at or above it), so that
it returns exactly what ``np.percentile(values, qs)`` returns (tests compare
the two bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentiles(values: Iterable[float], qs: Sequence[float]) -> list[float]:
    """The ``q``-th percentile of ``values`` (at least one) for each ``q`` in ``[0, 100]``."""
    ranked = sorted(values)
    if not ranked:
        raise ValueError("percentiles of no values")
    return [_at(ranked, q) for q in qs]


def _at(ranked: list[float], q: float) -> float:
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile must be in [0, 100], got {q}")
    index = (len(ranked) - 1) * (q / 100)
    lower = math.floor(index)
    if lower >= len(ranked) - 1:
        return float(ranked[-1])
    a, b = ranked[lower], ranked[lower + 1]
    gamma = index - lower
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
