"""``read_batch``: one load batch of the store tier, read, checked and copied into place.

Each object is read through the tier's ``StoreIO`` (into registered staging
memory, or as ``bytes``), checked there (``entry_file.check_entry``: header,
fingerprint, key, sizes, checksum) and only then copied into its ``into``
buffers; without ``into`` its parts are handed out (copies, under
``StagedIO``, since the staging memory is reused). A unit is never copied
into ``into`` before its checks pass; a failed check leaves ``into`` as it
was or partly written, and the load fails (the caller recomputes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridkv.tiers import entry_file
from hybridkv.tiers.base import CorruptEntryError, UnitKey
from hybridkv.tiers.batch_item import Outcome
from hybridkv.tiers.store_client import UNREACHABLE
from hybridkv.tiers.store_io import MISSING, NO_STAGING, TOO_LARGE, StoreIO


@dataclass(slots=True)
class ReadBatch:
    """What one batch read: an outcome per unit, and what the tier counts or removes."""

    outcomes: list[Outcome]
    nbytes: int = 0  # bytes of objects read
    no_staging: int = 0  # units larger than the read staging (failed loads)
    missing: set[UnitKey] = field(default_factory=set)  # not held (or unreachable)
    corrupt: list[str] = field(default_factory=list)  # names whose object failed a check


def read_batch(
    io: StoreIO,
    digest: bytes,
    keys: Sequence[UnitKey],
    names: Sequence[str],
    targets: Sequence[list[memoryview] | None],
    intos: Sequence[Sequence[Any] | None],
) -> ReadBatch:
    """Read, check and place each unit (module docstring); ``(result, error)`` each:
    ``KeyError`` for a miss (not held, unreachable, no staging room),
    ``CorruptEntryError`` for an object that failed a check."""
    sizes = [
        None if t is None else entry_file.header_length(k, len(t)) + sum(v.nbytes for v in t)
        for k, t in zip(keys, targets, strict=True)
    ]
    out = ReadBatch([(None, None)] * len(keys))
    for i, data in io.read(names, sizes):  # a view is valid until the next item
        key, target, name = keys[i], targets[i], names[i]
        if isinstance(data, int):
            if data in (MISSING, UNREACHABLE):
                out.missing.add(key)
            out.no_staging += data == NO_STAGING
            if data == TOO_LARGE:  # not what this fingerprint writes under this name
                out.corrupt.append(name)
            out.outcomes[i] = (None, _read_error(name, data))
            continue
        out.nbytes += data.nbytes
        try:
            parts = entry_file.check_entry(data, digest, key, name)
        except CorruptEntryError as e:
            out.corrupt.append(name)
            out.outcomes[i] = (None, e)
            continue
        if target is None:  # staging is reused: hand out copies
            out.outcomes[i] = (tuple(bytes(p) for p in parts) if io.zero_copy else parts, None)
            continue
        if [t.nbytes for t in target] != [p.nbytes for p in parts]:
            error = CorruptEntryError("the entry's part sizes differ from into's")
            out.outcomes[i] = (None, error)
            continue
        for t, p in zip(target, parts, strict=True):
            t[:] = p
        out.outcomes[i] = (tuple(intos[i] or ()), None)
    return out


def _read_error(name: str, code: int) -> BaseException:
    """The error of a unit that ``StoreIO.read`` answered with ``code``."""
    if code in (MISSING, UNREACHABLE):
        return KeyError(f"STORE tier: {name} is not in the store")
    if code == NO_STAGING:  # a miss: recomputed
        return KeyError(f"STORE tier: {name} is larger than the staging memory for reads")
    if code == TOO_LARGE:
        return CorruptEntryError(f"{name} is larger than its parts in into")
    return OSError(f"STORE tier: reading {name} failed with code {code}")
