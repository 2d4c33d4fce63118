"""Grouping: split the layers of each kind into groups of ``g`` slots.

After unification every layer kind (bucket: layers with equal specs) fills
buffer slots of one size, ``pack`` layers per slot. A grouping picks ``g``,
the number of shared buffers: each group holds at most ``g`` slots of one
kind, and buffer ``i`` holds slot ``i`` of every group (different groups use
different block ids, so they never collide). A group with fewer than
``g * pack`` layers leaves *padding layers*: memory reserved for every block
of that group that no layer uses.

- ``vllm``: vLLM's heuristic, exactly: ``g`` is the smallest slot count
  among kinds, or the largest when the largest is below 1.5x the smallest.
- ``auto``: the ``g`` that wastes the fewest bytes for one request of
  ``max_model_len`` tokens (padding weighted by how many blocks the group
  needs: padding in a full-attention group costs far more than in a
  sliding-window group at long context), ties broken by fewer groups, then
  fewer padding layers; at most ``max(vllm's group count, max_groups)``
  groups. vLLM's ``g`` is a candidate, so auto never wastes more.

Layers are dealt to a kind's groups strided (layer ``j`` of a kind with
``G`` groups goes to group ``j % G``), as vLLM does.

Costing a candidate ``g`` needs only counts per kind (``grouping_cost``, closed
form, no layer lists), so trying every ``g`` is O(kinds) each and the layer
lists are built once, for the grouping picked (``make_grouping``): planning
stays near-linear in the layer count (20,000 layers: ~3,300 candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.managers.snapshots import SNAPSHOT_BLOCKS_PER_REQUEST, snapshot_reserve_blocks
from hybridkv.planning.unify import UnifiedSpecs
from hybridkv.specs import KVCacheSpec, MambaSpec
from hybridkv.specs.base import cdiv

GROUPINGS = ("vllm", "auto")


@dataclass(frozen=True)
class Bucket:
    """All layers with one (unified) spec, ``pack`` of them per slot."""

    spec: KVCacheSpec
    layers: tuple[str, ...]
    pack: int

    @property
    def slots(self) -> int:
        return cdiv(len(self.layers), self.pack)


@dataclass(frozen=True)
class PlannedGroup:
    """One KV cache group: its spec and layers, in slot order (``pack`` per slot)."""

    spec: KVCacheSpec
    layers: tuple[str, ...]
    pack: int

    def slot_layers(self, slot: int) -> tuple[str, ...]:
        """The layers of this group living in buffer ``slot``."""
        return self.layers[slot * self.pack : (slot + 1) * self.pack]


@dataclass(frozen=True)
class GroupingCost:
    """What a grouping with ``group_size`` buffers costs, without its layer lists."""

    group_size: int
    num_groups: int
    padding_layers: int
    waste_bytes_per_request: int
    bytes_per_request: int

    @property
    def waste_fraction(self) -> float:
        """Wasted share of the memory one ``max_model_len`` request takes."""
        return self.waste_bytes_per_request / self.bytes_per_request


@dataclass(frozen=True)
class Grouping(GroupingCost):
    """A grouping with ``group_size`` buffers: its groups, and what it wastes."""

    groups: tuple[PlannedGroup, ...] = ()

    def __post_init__(self) -> None:
        assert len(self.groups) == self.num_groups, (len(self.groups), self.num_groups)


def buckets_of(unified: UnifiedSpecs) -> list[Bucket]:
    """Layers grouped by equal spec, kinds in order of first appearance."""
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in unified.specs.items():
        by_spec.setdefault(spec, []).append(name)
    return [Bucket(s, tuple(names), unified.pack[s]) for s, names in by_spec.items()]


def vllm_group_size(buckets: list[Bucket]) -> int:
    """vLLM's heuristic: min slot count, or max when max < 1.5 x min."""
    lo = min(b.slots for b in buckets)
    hi = max(b.slots for b in buckets)
    return hi if hi < lo * 1.5 else lo


#: A Mamba group holds a request's running state and its latest snapshot; the
#: snapshots a step writes are reserved once for all requests
#: (``mamba_reserve_blocks``). The rule lives in ``hybridkv.managers.snapshots``.
MAMBA_BLOCKS_PER_REQUEST = SNAPSHOT_BLOCKS_PER_REQUEST


def blocks_per_request(spec: KVCacheSpec, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Blocks one request of ``max_model_len`` tokens holds in a group of ``spec``.

    Attention kinds: their worst case (``max_memory_usage_bytes``, as vLLM
    counts it). Mamba: ``MAMBA_BLOCKS_PER_REQUEST``.
    """
    if isinstance(spec, MambaSpec):
        return MAMBA_BLOCKS_PER_REQUEST
    return spec.max_memory_usage_bytes(max_model_len, max_num_batched_tokens) // (
        spec.page_size_bytes
    )


def mamba_reserve_blocks(groups: tuple[PlannedGroup, ...], max_num_batched_tokens: int) -> int:
    """Blocks set aside for the snapshots of one step, over all requests."""
    return snapshot_reserve_blocks(
        [g.spec.block_size for g in groups if isinstance(g.spec, MambaSpec)],
        max_num_batched_tokens,
    )


def _real_bytes(spec: KVCacheSpec) -> int:
    return spec.state_size_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes


@dataclass(frozen=True)
class _BucketCost:
    """A bucket's counts that every candidate ``g`` reuses (computed once)."""

    slots: int
    num_layers: int
    pack: int
    blocks: int  # blocks one max_model_len request holds in one of its groups
    real_bytes: int  # bytes of a slot one layer really uses


def _bucket_costs(
    buckets: list[Bucket], max_model_len: int, max_num_batched_tokens: int
) -> list[_BucketCost]:
    return [
        _BucketCost(
            b.slots,
            len(b.layers),
            b.pack,
            blocks_per_request(b.spec, max_model_len, max_num_batched_tokens),
            _real_bytes(b.spec),
        )
        for b in buckets
    ]


def grouping_cost(costs: list[_BucketCost], group_size: int, slot_bytes: int) -> GroupingCost:
    """The cost of ``group_size`` buffers, in O(kinds) (the module docstring).

    A bucket of ``n`` layers in ``G = cdiv(slots, g)`` groups pads ``G*g*pack - n``
    layer places; each group's page is ``g * slot_bytes``, of which its layers
    really use ``len(layers) * real_bytes``, so the sums over groups close.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    page = group_size * slot_bytes
    num_groups = padding = waste = total = 0
    for c in costs:
        n_groups = cdiv(c.slots, group_size)
        num_groups += n_groups
        padding += n_groups * group_size * c.pack - c.num_layers
        waste += (n_groups * page - c.num_layers * c.real_bytes) * c.blocks
        total += n_groups * page * c.blocks
    return GroupingCost(group_size, num_groups, padding, waste, total)


def make_grouping(
    buckets: list[Bucket],
    group_size: int,
    slot_bytes: int,
    max_model_len: int,
    max_num_batched_tokens: int,
) -> Grouping:
    """Split every bucket into groups of ``group_size`` slots, with its cost."""
    cost = grouping_cost(
        _bucket_costs(buckets, max_model_len, max_num_batched_tokens), group_size, slot_bytes
    )
    groups: list[PlannedGroup] = []
    for b in buckets:
        n_groups = cdiv(b.slots, group_size)
        groups.extend(PlannedGroup(b.spec, b.layers[k::n_groups], b.pack) for k in range(n_groups))
    return Grouping(
        cost.group_size,
        cost.num_groups,
        cost.padding_layers,
        cost.waste_bytes_per_request,
        cost.bytes_per_request,
        tuple(groups),
    )


def vllm_grouping(
    unified: UnifiedSpecs, max_model_len: int, max_num_batched_tokens: int
) -> Grouping:
    """The grouping vLLM's heuristic makes (and only that one)."""
    buckets = buckets_of(unified)
    return make_grouping(
        buckets,
        vllm_group_size(buckets),
        unified.slot_bytes,
        max_model_len,
        max_num_batched_tokens,
    )


def grouping_candidates(
    unified: UnifiedSpecs, max_model_len: int, max_num_batched_tokens: int
) -> tuple[tuple[GroupingCost, ...], GroupingCost]:
    """The cost of every candidate ``g`` from 1 to the largest slot count, and vLLM's."""
    buckets = buckets_of(unified)
    costs = _bucket_costs(buckets, max_model_len, max_num_batched_tokens)
    hi = max(b.slots for b in buckets)
    choices = tuple(grouping_cost(costs, g, unified.slot_bytes) for g in range(1, hi + 1))
    return choices, choices[vllm_group_size(buckets) - 1]


def pick_grouping(
    choices: tuple[GroupingCost, ...], vllm: GroupingCost, mode: str, max_groups: int = 8
) -> GroupingCost:
    """The candidate ``mode`` (``vllm`` or ``auto``) picks among ``choices``."""
    if mode not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {mode!r}")
    if mode == "vllm":
        return vllm
    cap = max(vllm.num_groups, max_groups)
    options = [g for g in choices if g.num_groups <= cap]
    best = min(options, key=lambda g: (g.waste_bytes_per_request, g.num_groups, g.padding_layers))
    assert best.waste_bytes_per_request <= vllm.waste_bytes_per_request
    return best


def choose_grouping(
    unified: UnifiedSpecs,
    mode: str,
    *,
    max_model_len: int,
    max_num_batched_tokens: int,
    max_groups: int = 8,
) -> Grouping:
    """The grouping ``mode`` (``vllm`` or ``auto``) picks; see the module doc."""
    if mode not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {mode!r}")
    if mode == "vllm":
        return vllm_grouping(unified, max_model_len, max_num_batched_tokens)
    choices, vllm = grouping_candidates(unified, max_model_len, max_num_batched_tokens)
    picked = pick_grouping(choices, vllm, mode, max_groups)
    return make_grouping(
        buckets_of(unified),
        picked.group_size,
        unified.slot_bytes,
        max_model_len,
        max_num_batched_tokens,
    )
