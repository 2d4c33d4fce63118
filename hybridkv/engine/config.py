"""``LLM``'s settings as three frozen, validated objects (vLLM's names).

- ``CacheConfig``: the KV cache: block size, prefix caching, memory, hashing,
  the cache policy and its ``HybridOptions``, the host and disk tiers below
  the device pool (vLLM's ``kv_offloading_size`` etc.; ``hybridkv.offload``);
- ``SchedulerConfig``: how much runs at once and how long a request may be;
- ``ExecutionConfig``: where and how steps run: dtype, device, kernel backend,
  CUDA graphs.

``LLM`` takes them whole (``LLM(model, cache_config=CacheConfig(...))``) or
builds them from its keyword arguments of the same names (``LLM(model,
block_size=32)``), with the same defaults; ``build_configs`` does that, and
refuses a keyword set away from its default next to the object that holds
it. Each object checks its fields when made: a bad value is a ``ValueError``
naming the field. (KV events keep their own ``KVEventsConfig``.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch

from hybridkv.core.hashing import HASH_ALGOS
from hybridkv.engine.engine_setup import check_dtype, check_flag, positive
from hybridkv.offload.swap import PREEMPTION_MODES
from hybridkv.policy import HybridOptions, check_cache_policy


@dataclass(frozen=True)
class CacheConfig:
    """The KV cache (module docstring). ``hybrid``: the ``hybrid`` policy's
    settings (None: its defaults); set under ``lru`` it is an error, since it
    would change nothing. ``kv_offloading_size``: GiB of host RAM for a tier
    under the device pool (None: none); ``kv_offloading_backend``: ``"native"``
    (the only one); ``disk_cache_dir`` / ``disk_cache_size`` (GiB): a disk
    tier under the host tier, kept across restarts; ``kv_store``: the URL of a
    Mooncake Store shared by replicas, a tier under those (or alone):
    ``mooncake://HOST:PORT?metadata=...`` (``hybridkv.tiers.store_url``;
    ``docs/tiers.md``)."""

    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None
    hash_algo: str = "sha256"
    cache_policy: str = "lru"
    hybrid: HybridOptions | None = None
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    disk_cache_dir: str | os.PathLike[str] | None = None
    disk_cache_size: float | None = None
    kv_store: str | None = None

    def __post_init__(self) -> None:
        check_cache_policy(self.cache_policy)
        if isinstance(self.disk_cache_dir, os.PathLike):
            object.__setattr__(self, "disk_cache_dir", os.fspath(self.disk_cache_dir))
        check_tier_settings(self)
        if self.hybrid is not None:
            if not isinstance(self.hybrid, HybridOptions):
                raise ValueError(f"hybrid must be a HybridOptions, got {self.hybrid!r}")
            if self.cache_policy != "hybrid":
                raise ValueError(
                    "hybrid tunes cache_policy='hybrid'; it changes nothing under "
                    f"{self.cache_policy!r}"
                )
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(f"hash_algo must be one of {HASH_ALGOS}, got {self.hash_algo!r}")
        positive(self.block_size, "block_size")
        if self.kv_cache_memory_bytes is not None:
            positive(self.kv_cache_memory_bytes, "kv_cache_memory_bytes")
        check_flag(self.enable_prefix_caching, "enable_prefix_caching")


def _gib(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a size in GiB > 0 (e.g. 4 or 0.5), got {value!r}")


def _needs_exact_hits(cache: CacheConfig, name: str) -> None:
    if not cache.enable_prefix_caching:
        raise ValueError(f"{name} needs enable_prefix_caching=True")
    if cache.hash_algo != "sha256":
        raise ValueError(
            f"{name} needs hash_algo='sha256': a tier hit is not checked "
            f"token by token, so {cache.hash_algo!r} (not collision-resistant) is refused"
        )


def check_tier_settings(cache: CacheConfig) -> None:
    """The tier fields of ``cache`` (``ValueError`` naming the field and the fix)."""
    if cache.kv_offloading_backend != "native":
        raise ValueError(
            f"kv_offloading_backend must be 'native', got {cache.kv_offloading_backend!r}"
        )
    if cache.kv_store is not None:
        from hybridkv.tiers.store_url import parse_store_url

        parse_store_url(cache.kv_store)  # a TierError (ValueError) naming the field
        _needs_exact_hits(cache, "kv_store")
    if cache.kv_offloading_size is None:
        if cache.disk_cache_dir is not None or cache.disk_cache_size is not None:
            raise ValueError(
                "disk_cache_dir needs kv_offloading_size: the disk tier is fed by the "
                "host tier; give both"
            )
        return
    _gib(cache.kv_offloading_size, "kv_offloading_size")
    _needs_exact_hits(cache, "kv_offloading_size")
    if (cache.disk_cache_dir is None) != (cache.disk_cache_size is None):
        raise ValueError("disk_cache_dir and disk_cache_size (GiB) go together: give both")
    if cache.disk_cache_size is not None:
        _gib(cache.disk_cache_size, "disk_cache_size")
    if cache.disk_cache_dir is not None and not isinstance(cache.disk_cache_dir, str):
        raise ValueError(f"disk_cache_dir must be a path string, got {cache.disk_cache_dir!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Requests per step and their length: ``max_model_len`` None is the
    model's; beyond the model's positions it needs ``allow_long_max_model_len``
    (``hybridkv.layouts.context_length``). ``preemption_mode`` (vLLM's name):
    with a host tier (``kv_offloading_size``), ``"swap"`` stores a preempted
    request's blocks there for its resume, ``"recompute"`` never does, and None
    lets the load-or-recompute cost model decide (``hybridkv/offload/swap.py``).
    ``async_scheduling`` (vLLM's name): schedule and fill the next step while one
    runs on the device (``hybridkv/engine/async_step.py``; with the tiers too:
    ``hybridkv/offload/inflight_step.py``)."""

    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    allow_long_max_model_len: bool = False
    preemption_mode: str | None = None
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        positive(self.max_num_seqs, "max_num_seqs")
        positive(self.max_num_batched_tokens, "max_num_batched_tokens")
        if self.max_model_len is not None:
            positive(self.max_model_len, "max_model_len")
        check_flag(self.allow_long_max_model_len, "allow_long_max_model_len")
        check_flag(self.async_scheduling, "async_scheduling")
        if self.preemption_mode not in (None, *PREEMPTION_MODES):
            raise ValueError(
                f"preemption_mode must be None or one of {PREEMPTION_MODES}, "
                f"got {self.preemption_mode!r}"
            )


@dataclass(frozen=True)
class ExecutionConfig:
    """Where steps run: ``dtype`` / ``device`` ``"auto"`` or a name (or torch
    object); ``kernel_backend`` None: Triton on CUDA, native C on the CPU
    (``engine_setup.resolve_kernel_backend``); ``cuda_graphs``: replay steps
    from CUDA graphs; ``merge_projections``: run each layer's q/k/v (and gate/up)
    projections as one GEMM (``models/layers/merged_linear.py``: bit-identical in fp32
    on the CPU, may round differently in bf16; False keeps them apart)."""

    dtype: str | torch.dtype = "auto"
    device: str | torch.device = "auto"
    kernel_backend: str | None = None
    cuda_graphs: bool = False
    merge_projections: bool = True

    def __post_init__(self) -> None:
        check_flag(self.cuda_graphs, "cuda_graphs")
        check_flag(self.merge_projections, "merge_projections")
        check_dtype(self.dtype)


#: The ``hybrid_*`` keywords of ``LLM`` (``HybridOptions.from_knobs``).
HYBRID_KEYWORDS = (
    "hybrid_return_bonus",
    "hybrid_return_grade",
    "hybrid_value_weight",
    "hybrid_floor_tokens",
    "hybrid_tuning",
)


#: Every ``LLM`` keyword argument that ``build_configs`` reads.
KEYWORDS = frozenset(
    {f.name for cls in (CacheConfig, SchedulerConfig, ExecutionConfig) for f in fields(cls)}
    | set(HYBRID_KEYWORDS)
)


def _from_keywords(cls: type, given: Any, keywords: dict[str, Any], name: str) -> Any:
    """``given`` (a ``cls``) when no keyword of its fields moved off its
    default, else a ``cls`` built from ``keywords``."""
    own = {f.name: keywords[f.name] for f in fields(cls) if f.name in keywords}
    if given is None:
        return cls(**own)
    if not isinstance(given, cls):
        raise ValueError(f"{name} must be a {cls.__name__}, got {given!r}")
    defaults = cls()
    moved = [
        k for k, v in own.items() if v is not getattr(defaults, k) and v != getattr(defaults, k)
    ]
    if moved:
        raise ValueError(
            f"{moved[0]} is set twice: as a keyword and in {name}; give it in one place"
        )
    return given


def build_configs(
    cache_config: CacheConfig | None,
    scheduler_config: SchedulerConfig | None,
    execution_config: ExecutionConfig | None,
    keywords: dict[str, Any],
) -> tuple[CacheConfig, SchedulerConfig, ExecutionConfig]:
    """The three configs from ``LLM``'s objects and keyword arguments (module docstring)."""
    if cache_config is None:
        check_cache_policy(keywords["cache_policy"])
    knobs = {k: keywords.pop(k) for k in HYBRID_KEYWORDS}
    given = [k for k, v in knobs.items() if v is not None]
    hybrid = keywords.get("hybrid")
    if given:
        policy = keywords["cache_policy"] if cache_config is None else cache_config.cache_policy
        opts = HybridOptions.from_knobs(hybrid, **{k: knobs[k] for k in given})
        if policy != "hybrid":
            raise ValueError(
                f"{given[0]} tunes cache_policy='hybrid'; it changes nothing under {policy!r}"
            )
        if cache_config is not None:
            raise ValueError(f"{given[0]} is set twice: as a keyword and in cache_config")
        keywords["hybrid"] = opts
    cache = _from_keywords(CacheConfig, cache_config, keywords, "cache_config")
    scheduler = _from_keywords(SchedulerConfig, scheduler_config, keywords, "scheduler_config")
    execution = _from_keywords(ExecutionConfig, execution_config, keywords, "execution_config")
    if scheduler.preemption_mode == "swap" and cache.kv_offloading_size is None:
        raise ValueError(
            "preemption_mode='swap' needs a host tier to swap to: set kv_offloading_size"
        )
    return cache, scheduler, execution
