"""``heap_freeze``: an engine's start-up freezes the heap once, its close unfreezes it,
and nothing it did not freeze is unfrozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.engine.heap_freeze import freeze_startup_heap, release_heap


class _Engine:
    """A stand-in owner (weak-referenceable)."""


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_first_start_freezes_and_its_close_unfreezes() -> None:
    first, second = _Engine(), _Engine()
    unfreeze = freeze_startup_heap(first)
    assert unfreeze is not None and gc.get_freeze_count() > 0
    kept = object()  # made after the freeze: not frozen
    assert freeze_startup_heap(second) is None  # frozen already: the second freezes nothing
    release_heap(None)  # the second's close: nothing of its own to release
    assert gc.get_freeze_count() > 0
    release_heap(unfreeze)
    assert gc.get_freeze_count() == 0
    release_heap(unfreeze)  # twice: nothing more
    assert kept is not None


def test_what_someone_else_froze_stays_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    engine = _Engine()
    release_heap(freeze_startup_heap(engine))
    assert gc.get_freeze_count() == frozen


def test_an_engine_freed_without_close_unfreezes() -> None:
    engine = _Engine()
    assert freeze_startup_heap(engine) is not None
    del engine  # freed by reference counting: its finalizer unfreezes
    assert gc.get_freeze_count() == 0


def test_the_llm_freezes_after_start_up_and_unfreezes_at_close(tmp_path: Path) -> None:
    ckpt = save_checkpoint(gemma3_config(), tmp_path)
    llm = LLM(ckpt, block_size=4, max_model_len=64, device="cpu")
    pool = llm.manager.block_pool.blocks
    frozen = gc.get_freeze_count()
    assert frozen >= len(pool)  # every block of the pool is out of the collector's walks
    other = LLM(ckpt, block_size=4, max_model_len=64, device="cpu")
    # The second engine froze nothing. The count is not compared for equality: a
    # frozen object freed by reference counting (a cache entry of an earlier test in
    # this worker) leaves the permanent generation, so the count can only fall, while
    # a second freeze would add at least the second pool's blocks.
    assert gc.get_freeze_count() <= frozen
    other.close()
    assert gc.get_freeze_count() >= len(pool)  # and unfreezes nothing: the first pool stays
    llm.close()
    assert gc.get_freeze_count() == 0
