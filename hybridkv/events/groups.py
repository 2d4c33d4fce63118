"""What identifies a KV cache group on the wire, and how a block hash is sent.

vLLM 0.33 tags every event with ``group_idx`` (the KV cache group's index)
and every ``BlockStored`` with the group's ``kv_cache_spec_kind`` (the value of
its ``KVCacheSpecKind`` enum) and ``kv_cache_spec_sliding_window`` (the window
of a sliding-window group, else None), so a consumer of a hybrid model can
tell a full-attention block from a sliding-window one. Pure functions; no
ZeroMQ or msgspec here.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

#: Our spec classes -> vLLM 0.33's ``KVCacheSpecKind`` values (subclasses first).
VLLM_SPEC_KINDS: tuple[tuple[type[KVCacheSpec], str], ...] = (
    (SlidingWindowSpec, "sliding_window"),
    (ChunkedLocalAttentionSpec, "chunked_local_attention"),
    (FullAttentionSpec, "full_attention"),
    (MambaSpec, "mamba"),
)

_UINT64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class GroupEventInfo:
    """The group fields a ``BlockStored`` carries for one KV cache group."""

    kind: str
    sliding_window: int | None


def spec_event_info(spec: KVCacheSpec) -> GroupEventInfo:
    """vLLM's kind string (``"unknown"`` for a spec it has no kind for) and window."""
    kind = next((k for cls, k in VLLM_SPEC_KINDS if isinstance(spec, cls)), "unknown")
    window = spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None
    return GroupEventInfo(kind, window)


def group_event_infos(config: KVCacheConfig) -> tuple[GroupEventInfo, ...]:
    """One ``GroupEventInfo`` per KV cache group, indexed by group id."""
    return tuple(spec_event_info(g.kv_cache_spec) for g in config.kv_cache_groups)


def external_hash(block_hash: bytes, as_int: bool) -> bytes | int:
    """A block hash as published: the raw bytes, or (vLLM's default) the uint64
    read big-endian from its last 8 bytes.
    """
    if not as_int:
        return block_hash
    return int.from_bytes(block_hash, "big") & _UINT64
