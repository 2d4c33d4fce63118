"""``LLM``'s settings as ``CacheConfig`` / ``SchedulerConfig`` / ``ExecutionConfig``
(``hybridkv.engine.config``): the keywords build them with today's defaults; an
object and a keyword for the same field is an error; every check names the field."""

from __future__ import annotations

from typing import Any

import pytest

from hybridkv import HybridOptions
from hybridkv.engine import LLM
from hybridkv.engine.config import (
    KEYWORDS,
    CacheConfig,
    ExecutionConfig,
    SchedulerConfig,
    build_configs,
)


def keywords(**changes: Any) -> dict[str, Any]:
    """``LLM``'s keyword defaults (read from its signature), with ``changes``."""
    import inspect

    params = inspect.signature(LLM.__init__).parameters
    out = {k: params[k].default for k in KEYWORDS}
    out.update(changes)
    return out


def test_the_keywords_build_the_configs_with_the_same_defaults() -> None:
    cache, sched, run = build_configs(None, None, None, keywords())
    assert (cache, sched, run) == (CacheConfig(), SchedulerConfig(), ExecutionConfig())
    assert set(keywords()) >= KEYWORDS  # every field is still an LLM keyword
    cache, sched, _ = build_configs(
        None, None, None, keywords(block_size=32, max_num_seqs=8, cache_policy="hybrid")
    )
    assert (cache.block_size, cache.cache_policy, sched.max_num_seqs) == (32, "hybrid", 8)


def test_hybrid_keywords_become_hybrid_options() -> None:
    cache, _, _ = build_configs(
        None,
        None,
        None,
        keywords(cache_policy="hybrid", hybrid_value_weight=2.0, hybrid_tuning={"floor_ratio": 8}),
    )
    assert cache.hybrid is not None
    assert (cache.hybrid.value_weight, cache.hybrid.tuning.floor_ratio) == (2.0, 8)
    with pytest.raises(ValueError, match="hybrid_value_weight tunes cache_policy='hybrid'"):
        build_configs(None, None, None, keywords(hybrid_value_weight=2.0))
    with pytest.raises(ValueError, match="hybrid tunes cache_policy='hybrid'"):
        CacheConfig(hybrid=HybridOptions())


def test_an_object_and_a_keyword_for_one_field_is_an_error() -> None:
    given = CacheConfig(block_size=32)
    assert build_configs(given, None, None, keywords())[0] is given
    with pytest.raises(ValueError, match="block_size is set twice"):
        build_configs(given, None, None, keywords(block_size=64))
    with pytest.raises(ValueError, match="max_num_seqs is set twice"):
        build_configs(None, SchedulerConfig(), None, keywords(max_num_seqs=8))
    with pytest.raises(ValueError, match="scheduler_config must be a SchedulerConfig"):
        build_configs(None, CacheConfig(), None, keywords())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size is set twice"):
        LLM("/nonexistent", block_size=64, cache_config=given)  # before the checkpoint is read


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CacheConfig(block_size=0), "block_size must be an int >= 1"),
        (lambda: CacheConfig(hash_algo="md5"), "hash_algo must be one of"),
        (lambda: CacheConfig(cache_policy="lfu"), "cache_policy must be one of"),
        (lambda: CacheConfig(enable_prefix_caching=1), "enable_prefix_caching must be True"),
        (lambda: SchedulerConfig(max_num_batched_tokens=-1), "max_num_batched_tokens must be"),
        (lambda: SchedulerConfig(max_model_len=0), "max_model_len must be an int >= 1"),
        (lambda: ExecutionConfig(dtype="int8"), "dtype 'int8' is not supported"),
        (lambda: ExecutionConfig(cuda_graphs="yes"), "cuda_graphs must be True or False"),
    ],
)
def test_each_config_names_a_bad_field(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()
