"""Helpers for tests that drive a ``TieredCache`` without the scheduler."""

from __future__ import annotations

from hybridkv import Request
from hybridkv.offload import TieredCache


def computed(tiers: TieredCache, r: Request) -> None:
    """The step that computed all of ``r``'s tokens ran (as ``Scheduler.update``
    tells the tiers): a write-through policy stores its blocks. Untimed."""
    tiers.after_step([(r, 0, r.num_tokens)], r.num_tokens, r.num_tokens, 0.0)
