"""The bytes on the wire: vLLM 0.33's KV event batch, encoded with msgspec.

Follows ``vllm/distributed/kv_events.py`` of vLLM 0.33.0 (our own classes, the
same encoding), so a consumer that decodes with vLLM's ``KVEventBatch`` reads
ours unchanged::

    batch   = msgpack array  [ts, [event, ...], data_parallel_rank]
    event   = msgpack map    {"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared",
                              <fields in declaration order; optional ones left out when None>}

``BlockStored``: ``block_hashes``, ``parent_block_hash``, ``token_ids``,
``block_size``, ``lora_id``, ``medium``, ``lora_name`` always present (None
allowed); then, when set, ``extra_keys``, ``group_idx``,
``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``, ``locality``,
``ownership``, ``session_id``, ``lookahead_token_ids``. ``BlockRemoved``:
``block_hashes``, ``medium``, then ``group_idx`` / ``locality`` /
``ownership`` when set. What hybridkv fills in: the group fields
(``groups.py``), ``medium``, ``lora_name``; ``lora_id`` (deprecated in vLLM;
we have no integer adapter ids), ``extra_keys``, ``locality``, ``ownership``,
``session_id`` and ``lookahead_token_ids`` stay None. ``data_parallel_rank``
is 0, as vLLM's publisher sets it for a single rank.

Needs ``msgspec`` (the ``events`` extra); import it through ``hybridkv.events``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from hybridkv.core import events as core
from hybridkv.events.groups import GroupEventInfo, external_hash

ExternalHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events: ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class WireEvent(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type"):
    """Base of the tagged event maps (the tag names the event)."""


class WireBlockStored(WireEvent, tag="BlockStored"):
    block_hashes: list[ExternalHash]
    parent_block_hash: ExternalHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class WireBlockRemoved(WireEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class WireAllBlocksCleared(WireEvent, tag="AllBlocksCleared"):
    pass


def wire_events(
    events: Sequence[core.KVCacheEvent],
    groups: Sequence[GroupEventInfo],
    medium: str | None,
    int_hashes: bool,
) -> list[WireEvent]:
    """Our events as vLLM's, in order; ``groups[group_id]`` gives the group fields."""
    out: list[WireEvent] = []
    for ev in events:
        if isinstance(ev, core.BlockStored):
            info = groups[ev.group_id]
            parent = ev.parent_block_hash
            out.append(
                WireBlockStored(
                    block_hashes=[external_hash(h, int_hashes) for h in ev.block_hashes],
                    parent_block_hash=None if parent is None else external_hash(parent, int_hashes),
                    token_ids=list(ev.token_ids),
                    block_size=ev.block_size,
                    lora_id=None,
                    medium=ev.medium or medium,
                    lora_name=ev.lora_name,
                    group_idx=ev.group_id,
                    kv_cache_spec_kind=info.kind,
                    kv_cache_spec_sliding_window=info.sliding_window,
                )
            )
        elif isinstance(ev, core.BlockRemoved):
            out.append(
                WireBlockRemoved(
                    block_hashes=[external_hash(h, int_hashes) for h in ev.block_hashes],
                    medium=ev.medium or medium,
                    group_idx=ev.group_id,
                )
            )
        elif isinstance(ev, core.AllBlocksCleared):
            out.append(WireAllBlocksCleared())
        else:
            raise TypeError(f"not a KV cache event: {ev!r}")
    return out


class BatchEncoder:
    """Encodes one step's events as one msgpack ``EventBatch`` payload."""

    def __init__(
        self, groups: Sequence[GroupEventInfo], medium: str | None, int_hashes: bool
    ) -> None:
        self.groups = tuple(groups)
        self.medium = medium
        self.int_hashes = int_hashes
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, ts: float, events: Sequence[core.KVCacheEvent]) -> bytes:
        """The payload frame: ``[ts, [event, ...], 0]``."""
        batch = EventBatch(
            ts=ts,
            events=wire_events(events, self.groups, self.medium, self.int_hashes),
            data_parallel_rank=0,
        )
        return self._encoder.encode(batch)
