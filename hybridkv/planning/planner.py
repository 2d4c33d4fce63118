"""The planner: model layout + memory budget -> ``KVCachePlan`` (what the engine needs).

Two stages, both pure functions:

- ``plan_pages`` (no memory budget): specs per layer, page-size unification
  and grouping. Its ``PagePlan`` knows the page size and the bytes one
  ``max_model_len`` request needs, which is what a caller needs to size a
  budget (the engine's default KV memory does).
- ``fit_memory`` (a ``PagePlan`` and a budget): ``num_blocks`` and the
  ``KVCacheConfig``; its ``KVCachePlan`` is the ``PagePlan`` plus those.

``plan_kv_cache`` runs both; ``get_kv_cache_config`` returns just the config.
Steps:

1. specs per layer (from a ``ModelLayout`` at ``block_size``, or given);
2. page-size unification (``unification="vllm"`` or ``"packed"``,
   ``unify.py``); for packed with Mamba layers, the attention pack factor
   (a divisor of every attention kind's layer count, so no slot is left
   part-empty) that gives the smallest block size within
   ``max_packed_groups`` groups;
3. grouping (``grouping="vllm"`` or ``"auto"``, ``grouping.py``);
4. ``num_blocks = available // (g * slot)``, one buffer per slot index
   (``KVCacheTensor`` of ``num_blocks * slot`` bytes, shared by slot ``i``
   of every group), and the plan's capacity (``capacity.py``).

Comparisons with other plans (naive full-attention KV, vLLM's grouping) are
the report's business (``hybridkv.report.baselines``), not the plan's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from hybridkv.common.units import format_bytes
from hybridkv.planning.capacity import Capacity, capacity
from hybridkv.planning.grouping import (
    Grouping,
    GroupingCost,
    blocks_per_request,
    buckets_of,
    grouping_candidates,
    make_grouping,
    mamba_reserve_blocks,
    pick_grouping,
    vllm_grouping,
)
from hybridkv.planning.unify import STRATEGIES, UnifiedSpecs, unify_packed, unify_vllm
from hybridkv.specs import (
    AttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
)
from hybridkv.specs.base import check_positive_int

if TYPE_CHECKING:
    from hybridkv.layouts import ModelLayout


@dataclass(frozen=True)
class PagePlan:
    """Unified specs and their grouping: everything but the memory budget.

    ``block_size`` is the requested block size (unification may make the
    attention blocks larger: see ``unified.specs``).
    """

    unified: UnifiedSpecs
    grouping: Grouping
    grouping_mode: str
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    choices: tuple[GroupingCost, ...]

    @property
    def slot_bytes(self) -> int:
        """Bytes of one block in one buffer."""
        return self.unified.slot_bytes

    @property
    def page_bytes(self) -> int:
        """Bytes of one block id across all buffers (one group's page)."""
        return self.grouping.group_size * self.unified.slot_bytes

    @property
    def bytes_per_request(self) -> int:
        """Bytes one request of ``max_model_len`` tokens needs over all groups."""
        return self.grouping.bytes_per_request

    @property
    def reserved_blocks(self) -> int:
        """Blocks no request can hold: the null block plus one step's Mamba checkpoints."""
        return _reserved_blocks(self.grouping, self.max_num_batched_tokens)

    @property
    def min_memory_bytes(self) -> int:
        """The smallest budget that holds one request of ``max_model_len`` tokens."""
        return (self.bytes_per_request // self.page_bytes + self.reserved_blocks) * self.page_bytes

    def group_blocks_per_request(self) -> list[int]:
        """Blocks each group needs for one ``max_model_len`` request."""
        return [
            blocks_per_request(g.spec, self.max_model_len, self.max_num_batched_tokens)
            for g in self.grouping.groups
        ]


@dataclass(frozen=True)
class KVCachePlan(PagePlan):
    """A ``PagePlan`` fitted to a memory budget: the config the engine builds from."""

    kv_cache_config: KVCacheConfig
    available_memory_bytes: int
    hybrid: Capacity  # this plan's capacity (requests of max_model_len that fit)

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks


def _as_layout(value: object) -> ModelLayout | None:
    """``value`` if it is a ``ModelLayout``, else None.

    ``hybridkv.layouts`` (pydantic models: 0.2-0.6 s to import on the CI box) is imported
    only here, so that ``import hybridkv.planning`` and planning from specs
    stay light; a caller holding a layout has imported it already.
    """
    if isinstance(value, dict):
        return None
    from hybridkv.layouts import ModelLayout

    return value if isinstance(value, ModelLayout) else None


def _specs_of(
    layout_or_specs: ModelLayout | dict[str, KVCacheSpec], block_size: int
) -> dict[str, KVCacheSpec]:
    layout = _as_layout(layout_or_specs)
    if layout is not None:
        return layout.kv_cache_specs(block_size)
    if not isinstance(layout_or_specs, dict) or not all(
        isinstance(s, KVCacheSpec) for s in layout_or_specs.values()
    ):
        raise ValueError("layout_or_specs must be a ModelLayout or a dict of layer -> KVCacheSpec")
    return dict(layout_or_specs)


def _unify(
    raw: dict[str, KVCacheSpec],
    unification: str,
    alignment: int,
    max_model_len: int,
    mnbt: int,
    max_packed_groups: int,
) -> UnifiedSpecs:
    if unification not in STRATEGIES:
        raise ValueError(f"unification must be one of {STRATEGIES}, got {unification!r}")
    if unification == "vllm":
        return unify_vllm(raw, alignment=alignment)
    has_mamba = any(isinstance(s, MambaSpec) for s in raw.values())
    attn_counts = Counter(s for s in raw.values() if isinstance(s, AttentionSpec))
    if not has_mamba or not attn_counts:
        return unify_packed(raw, pack_attention=1, alignment=alignment)
    # Pack factors that fill every slot (divide every attention kind's count).
    common = math.gcd(*attn_counts.values())
    packs = [p for p in range(1, common + 1) if common % p == 0]
    best: tuple[tuple[int, int, int], UnifiedSpecs] | None = None
    for p in packs:
        u = unify_packed(raw, pack_attention=p, alignment=alignment)
        g = vllm_grouping(u, max_model_len, mnbt)
        if g.num_groups > max_packed_groups and p > 1:
            continue
        key = (u.attention_block_size or 0, g.waste_bytes_per_request, p)
        if best is None or key < best[0]:
            best = (key, u)
    assert best is not None
    return best[1]


def _reserved_blocks(grouping: Grouping, mnbt: int) -> int:
    """The null block plus one step's Mamba checkpoints."""
    return mamba_reserve_blocks(grouping.groups, mnbt) + 1


def plan_capacity(
    available: int, unified: UnifiedSpecs, grouping: Grouping, mnbt: int, max_model_len: int
) -> Capacity:
    """Capacity of the whole pages of ``grouping`` that fit, less the reserved blocks."""
    page = grouping.group_size * unified.slot_bytes
    usable = max(available // page - _reserved_blocks(grouping, mnbt), 0) * page
    return capacity(usable, grouping.bytes_per_request, max_model_len)


def _config(unified: UnifiedSpecs, grouping: Grouping, num_blocks: int) -> KVCacheConfig:
    groups = [KVCacheGroupSpec(list(g.layers), g.spec) for g in grouping.groups]
    tensors = []
    for i in range(grouping.group_size):
        shared = [name for g in grouping.groups for name in g.slot_layers(i)]
        if shared:
            tensors.append(KVCacheTensor(num_blocks * unified.slot_bytes, shared))
    return KVCacheConfig(num_blocks, tensors, groups)


def plan_pages(
    layout_or_specs: ModelLayout | dict[str, KVCacheSpec],
    *,
    block_size: int = 16,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    grouping: str = "auto",
    unification: str = "vllm",
    max_groups: int = 8,
    max_packed_groups: int = 32,
    alignment: int = 16,
) -> PagePlan:
    """Unify and group the specs of a model (no memory budget yet).

    ``max_model_len`` defaults to the layout's; ``max_num_batched_tokens``
    (the largest step, which bounds sliding-window and Mamba checkpoint
    memory) to ``min(8192, max_model_len)``.
    """
    check_positive_int(block_size, "block_size")
    check_positive_int(alignment, "alignment")
    if max_model_len is None:
        layout = _as_layout(layout_or_specs)
        if layout is None:
            raise ValueError("max_model_len is required when planning from specs")
        max_model_len = layout.max_model_len
    check_positive_int(max_model_len, "max_model_len")
    mnbt = max_num_batched_tokens or min(8192, max_model_len)
    check_positive_int(mnbt, "max_num_batched_tokens")
    raw = _specs_of(layout_or_specs, block_size)
    unified = _unify(raw, unification, alignment, max_model_len, mnbt, max_packed_groups)
    choices, vllm_cost = grouping_candidates(unified, max_model_len, mnbt)
    picked = pick_grouping(choices, vllm_cost, grouping, max_groups)
    chosen = make_grouping(
        buckets_of(unified), picked.group_size, unified.slot_bytes, max_model_len, mnbt
    )
    return PagePlan(
        unified=unified,
        grouping=chosen,
        grouping_mode=grouping,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=mnbt,
        choices=choices,
    )


def fit_memory(pages: PagePlan, available_memory_bytes: int) -> KVCachePlan:
    """``pages`` with as many blocks as ``available_memory_bytes`` holds.

    Raises ``ValueError`` when the budget cannot hold one request of
    ``max_model_len`` tokens, naming the minimum.
    """
    check_positive_int(available_memory_bytes, "available_memory_bytes")
    page = pages.page_bytes
    num_blocks = available_memory_bytes // page
    need_blocks = pages.min_memory_bytes // page
    if num_blocks < need_blocks:
        need = pages.min_memory_bytes
        raise ValueError(
            f"{available_memory_bytes:,} bytes cannot hold one request of "
            f"max_model_len={pages.max_model_len} tokens: that needs {need_blocks} blocks of "
            f"{page:,} bytes = {need:,} bytes ({format_bytes(need)}) at least; "
            "raise the memory or lower max_model_len"
        )
    return KVCachePlan(
        **{f.name: getattr(pages, f.name) for f in fields(PagePlan)},
        kv_cache_config=_config(pages.unified, pages.grouping, num_blocks),
        available_memory_bytes=available_memory_bytes,
        hybrid=plan_capacity(
            available_memory_bytes,
            pages.unified,
            pages.grouping,
            pages.max_num_batched_tokens,
            pages.max_model_len,
        ),
    )


def plan_kv_cache(
    layout_or_specs: ModelLayout | dict[str, KVCacheSpec],
    available_memory_bytes: int,
    *,
    block_size: int = 16,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    grouping: str = "auto",
    unification: str = "vllm",
    max_groups: int = 8,
    max_packed_groups: int = 32,
    alignment: int = 16,
) -> KVCachePlan:
    """Plan the KV memory of a model: ``fit_memory(plan_pages(...), available)``.

    See ``plan_pages`` for the defaults. Raises ``ValueError`` when the
    budget cannot hold one request of ``max_model_len`` tokens, naming the
    minimum.
    """
    pages = plan_pages(
        layout_or_specs,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        grouping=grouping,
        unification=unification,
        max_groups=max_groups,
        max_packed_groups=max_packed_groups,
        alignment=alignment,
    )
    return fit_memory(pages, available_memory_bytes)


def get_kv_cache_config(
    layout_or_specs: ModelLayout | dict[str, KVCacheSpec],
    available_memory_bytes: int,
    **options: Any,
) -> KVCacheConfig:
    """The ``KVCacheConfig`` of ``plan_kv_cache`` (vLLM's name; the same
    keyword options, checked there)."""
    return plan_kv_cache(layout_or_specs, available_memory_bytes, **options).kv_cache_config
