"""Factories of the tier tests: fingerprints of small configs and unit keys."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from hybridkv.planning import get_kv_cache_config
from hybridkv.specs.attention import FullAttentionSpec, SlidingWindowSpec
from hybridkv.specs.config import KVCacheConfig
from hybridkv.specs.mamba import MambaSpec
from hybridkv.tiers import ModelFingerprint, MooncakeTier, UnitKey
from hybridkv.tiers.fingerprint import UNIT_LAYOUT
from hybridkv.tiers.transfer import FutureCompletion


def config(dtype: str = "bfloat16", block_size: int = 16, window: int = 32) -> KVCacheConfig:
    """A full-attention + sliding-window + Mamba config of a small model."""
    specs = {
        "layers.0": FullAttentionSpec(block_size, 2, 8, dtype),
        "layers.1": SlidingWindowSpec(block_size, 2, 8, dtype, sliding_window=window),
        "layers.2": MambaSpec(block_size, ((3, 4), (2, 4)), (dtype, "float32")),
    }
    return get_kv_cache_config(specs, 1 << 20, max_model_len=256)


def fingerprint(
    weights: str = "ckpt-a",
    dtype: str = "bfloat16",
    block_size: int = 16,
    layout: str = UNIT_LAYOUT,
) -> ModelFingerprint:
    return ModelFingerprint.from_kv_cache_config(config(dtype, block_size), weights, layout)


def key(i: int, group: int = 0) -> UnitKey:
    """A 32-byte block hash derived from ``i``."""
    return UnitKey(hashlib.sha256(str(i).encode()).digest(), group)


class GateCopier:
    """A copier that holds every job until ``run`` (transfers stay in flight meanwhile)."""

    threaded = True

    def __init__(self) -> None:
        self.jobs: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> FutureCompletion:
        future: Future[Any] = Future()
        self.jobs.append((future, fn, args))
        return FutureCompletion(future)

    def run(self, count: int | None = None) -> None:
        """Run the oldest ``count`` jobs (all by default), in order."""
        count = len(self.jobs) if count is None else count
        ready, self.jobs = self.jobs[:count], self.jobs[count:]
        for future, fn, args in ready:
            try:
                future.set_result(fn(*args))
            except Exception as e:
                future.set_exception(e)

    def close(self) -> None:
        self.run()


def tier_on(shared: MooncakeTier, queue: int = 1 << 20, **kw: Any) -> Iterator[MooncakeTier]:
    """A fixture's tier on ``shared``'s client with fresh counters: checked and closed
    after the test."""
    t = MooncakeTier(shared.fingerprint, shared.client, queue, owns_client=False, **kw)
    yield t
    t.check_integrity()
    t.close()
