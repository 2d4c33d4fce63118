"""Batches of device blocks' units into and out of the host tier.

``store_units`` takes units as ``(key, block id)``, ``load_units`` each
group's keys and block ids; they move them between the device's KV buffers
and the host tier. On the CPU (the host tier over a ``SlabMemory``,
``BlockBytes.has_rows``) each group's units of a batch move as one ``Rows``
transfer: one gather or scatter per layer and no tensor view per unit.
Elsewhere (CUDA: ``TorchHostMemory``) each unit moves as its parts (one view
per layer), each group's units as one batch: ``HostTier.store_parts`` /
``load_parts``, one transfer per group (on CUDA one copy-stream pass between
the device and pinned host buffers, one event after its copies).
``start_stores`` starts a batch of stores without waiting for them
(``HostStores``: write-through and swaps, asynchronous); ``store_units``
waits (``Demotion``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.tiers import HostTier, Transfer, UnitKey
from hybridkv.tiers.ledger import PinBatch


def _by_group(units: Sequence[tuple[UnitKey, int]]) -> dict[int, list[int]]:
    """Positions of ``units`` per group, in order."""
    groups: dict[int, list[int]] = {}
    for i, (key, _) in enumerate(units):
        groups.setdefault(key.group_id, []).append(i)
    return groups


def rows_ok(host: HostTier, block_bytes: BlockBytes) -> bool:
    """True when units move as rows: CPU KV buffers and a host tier over a ``SlabMemory``."""
    return block_bytes.has_rows and host.takes_rows


def start_stores(
    host: HostTier,
    block_bytes: BlockBytes,
    units: Sequence[tuple[UnitKey, int]],
    values: Sequence[float | None],
) -> list[Transfer | BaseException | None]:
    """Start storing each unit's block: one transfer per group, not waited for
    (as rows on the CPU, ``rows_ok``: one job on the copy thread; else as each
    unit's parts, ``HostTier.store_parts``: on CUDA one copy-stream pass and one
    event per group). Per unit: the transfer copying it (its group's), the error
    it was skipped with (``TierFullError``: no room), or None when the host
    holds it already or is storing it (touched, not copied; so is a key
    repeated in ``units`` after its first time)."""
    out: list[Transfer | BaseException | None] = [None] * len(units)
    groups = list(_by_group(units).items())
    keys = [[units[i][0] for i in at] for _, at in groups]
    ids = [[units[i][1] for i in at] for _, at in groups]
    vals = [[values[i] for i in at] for _, at in groups]
    if rows_ok(host, block_bytes):
        rows = [block_bytes.rows(gid, b) for (gid, _), b in zip(groups, ids, strict=True)]
        started = host.store_rows(list(zip(keys, rows, vals, strict=True)))
    else:
        parts = [
            [block_bytes.parts(gid, b) for b in bs]
            for (gid, _), bs in zip(groups, ids, strict=True)
        ]
        started = host.store_parts(list(zip(keys, parts, vals, strict=True)))
    for (_, at), (transfer, skipped) in zip(groups, started, strict=True):
        for k, error in skipped:
            out[at[k]] = error
        copied = set(transfer.keys)
        for i in at:
            key = units[i][0]
            if key in copied:
                out[i] = transfer
                copied.discard(key)  # a repeated key: its first unit is the one copied
    return out


def store_units(
    host: HostTier,
    block_bytes: BlockBytes,
    units: Sequence[tuple[UnitKey, int]],
    values: Sequence[float | None],
) -> list[BaseException | None]:
    """Store each unit's block into the host tier and wait for the copies: per
    unit, None once it is held, else the error (``TierFullError``: no room)."""
    out: list[BaseException | None] = []
    for started in start_stores(host, block_bytes, units, values):
        if isinstance(started, Transfer):
            out.append(None if started.wait() else started.error)
        else:
            out.append(started)
    return out


#: A group's units one load covers: ``(transfer, first unit, end)`` (None: not held).
Span = tuple["Transfer | None", int, int]


def load_units(
    host: HostTier,
    block_bytes: BlockBytes,
    groups: Sequence[tuple[int, list[UnitKey], list[int]]],
    wake: bool = True,
    pins: PinBatch | None = None,
) -> list[list[Span]]:
    """Start copying each group's units ``keys[k]`` (held by the host tier: pin
    them first) into blocks ``block_ids[k]``. Per group, the transfers and the
    units each covers: one transfer for all of them, as rows on the CPU
    (``rows_ok``: ``HostTier.load_rows``), else as each unit's parts
    (``HostTier.load_parts``); ``wake``, ``pins``: theirs (the pins are taken
    over)."""
    if not rows_ok(host, block_bytes):
        parted = [(keys, [block_bytes.parts(gid, b) for b in ids]) for gid, keys, ids in groups]
        started = host.load_parts(parted, wake=wake, pins=pins)
    else:
        started = host.load_rows(
            [(keys, block_bytes.rows(gid, ids)) for gid, keys, ids in groups],
            wake=wake,
            pins=pins,
        )
    return [[(t, 0, len(keys))] for t, (_, keys, _) in zip(started, groups, strict=True)]
