"""How a model's layers map onto blocks: groups, backing tensors, the config.

- ``KVCacheGroupSpec``: layers that share one spec and one block table per
  request (the same block ids index every layer of the group).
- ``KVCacheTensor``: one raw buffer of ``size`` bytes, shared by the listed
  layers (one layer of each group: different groups use different block ids,
  so they never touch the same page).
- ``KVCacheConfig``: ``num_blocks`` pages per buffer (block 0 is the reserved
  null block), the buffers, and the groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.specs.base import KVCacheSpec, check_positive_int


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """Layers sharing one spec (and one block table per request)."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec

    def __post_init__(self) -> None:
        if not self.layer_names:
            raise ValueError("layer_names must name at least one layer")
        if len(set(self.layer_names)) != len(self.layer_names):
            raise ValueError(f"layer_names has duplicates: {self.layer_names}")
        if not isinstance(self.kv_cache_spec, KVCacheSpec):
            raise ValueError(f"kv_cache_spec must be a KVCacheSpec, got {self.kv_cache_spec!r}")


@dataclass(frozen=True, slots=True)
class KVCacheTensor:
    """A raw buffer of ``size`` bytes shared by the layers in ``shared_by``."""

    size: int
    shared_by: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_positive_int(self.size, "KVCacheTensor.size")
        if not self.shared_by:
            raise ValueError("KVCacheTensor.shared_by must name at least one layer")


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """The whole KV memory plan the manager works from.

    ``kv_cache_tensors`` may be empty for scheduler-side bookkeeping only (no
    memory is described); when given, every layer of every group must live in
    exactly one tensor. A tensor is ``num_blocks`` equal slots; in each slot,
    the layers of one group found in ``shared_by`` are packed back to back
    from offset 0 (in ``shared_by`` order), and different groups overlap (they
    never use the same block id). Each group's pages must fit in one slot.
    """

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]

    def __post_init__(self) -> None:
        check_positive_int(self.num_blocks, "num_blocks")
        if self.num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the reserved null block), "
                f"got {self.num_blocks}"
            )
        if not self.kv_cache_groups:
            raise ValueError("kv_cache_groups must hold at least one group")
        layer_spec: dict[str, KVCacheSpec] = {}
        layer_group: dict[str, int] = {}
        for gi, g in enumerate(self.kv_cache_groups):
            for name in g.layer_names:
                if name in layer_spec:
                    raise ValueError(f"layer {name!r} appears in more than one group")
                layer_spec[name] = g.kv_cache_spec
                layer_group[name] = gi
        if not self.kv_cache_tensors:
            return
        placed: set[str] = set()
        for t in self.kv_cache_tensors:
            slot = t.size // self.num_blocks
            used: dict[int, int] = {}  # group index -> bytes of its layers in one slot
            for name in t.shared_by:
                if name not in layer_spec:
                    raise ValueError(f"KVCacheTensor.shared_by names unknown layer {name!r}")
                if name in placed:
                    raise ValueError(f"layer {name!r} is placed in more than one KVCacheTensor")
                placed.add(name)
                gi = layer_group[name]
                used[gi] = used.get(gi, 0) + layer_spec[name].page_size_bytes
                if used[gi] > slot:
                    raise ValueError(
                        f"KVCacheTensor of size {t.size} is too small for layer {name!r}: "
                        f"num_blocks={self.num_blocks} slots of {slot} bytes cannot hold "
                        f"the {used[gi]} bytes per block of group {gi}'s layers in it"
                    )
        missing = sorted(set(layer_spec) - placed)
        if missing:
            raise ValueError(f"layers without a KVCacheTensor: {missing}")

    def tensor_slot_bytes(self, tensor: KVCacheTensor) -> int:
        """Bytes of one block's slot in ``tensor`` (its size over ``num_blocks``)."""
        return tensor.size // self.num_blocks
