"""Checks of the launch overrides the Triton ops take for tuning (``TritonTiles``,
``ScanTiles``): each raises ``ValueError`` naming the field and what it must be."""

from __future__ import annotations


def power_of_two(name: str, value: int | None, low: int, high: int) -> None:
    """``value`` is None (keep the rule) or a power of two in ``[low, high]``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value & (value - 1) != 0:
        raise ValueError(f"{name}: must be a power of two, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: must be in [{low}, {high}], got {value}")


def stage_count(value: int | None) -> None:
    """``num_stages`` is None (Triton's default) or an integer in ``[1, 8]``."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8
    ):
        raise ValueError(f"num_stages: must be an integer in [1, 8], got {value!r}")
