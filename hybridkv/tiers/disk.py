"""``DiskTier``: hit units as files in a local folder, under a byte budget.

Each entry is one file (``entry_file.py``: header with the model fingerprint,
group and block hash, part sizes, an xxh3-128 checksum of every byte),
written atomically by one I/O thread (the folder fsynced once per batch), under
``<directory>/<fingerprint hex[:32]>/`` (``disk_dir.py``: folders 0700,
files 0600, one process per folder). ``used_bytes`` counts whole files.

It survives a restart: a new ``DiskTier`` on the same folder
- removes temporary files of interrupted writes (``leftovers_removed``);
- checks each entry's header (magic, version, fingerprint, key = file name,
  file length) and removes those that fail (``corrupt_removed``);
- serves the rest, least recently used first out (file mtime order; a load
  touches its file), evicting past the budget if it shrank;
- checks the checksum on every load: a mismatch is a failed load (a miss),
  and the entry is removed and counted.
Another fingerprint's folder is never read: its entries are never a hit.

Disk full: a store that the budget cannot hold, or whose write fails with
``ENOSPC`` / ``EDQUOT``, is skipped (``TierFullError``, one warning, counted);
any other write error likewise (``store_failures``). Nothing half-written is
ever served: an entry is visible only once its file has been renamed into place.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridkv.tiers import entry_file
from hybridkv.tiers.base import CorruptEntryError, Parts, UnitKey
from hybridkv.tiers.copier import Copier, ThreadCopier
from hybridkv.tiers.disk_dir import (
    LOCK_NAME,
    TMP_SUFFIX,
    close_folder,
    entry_name,
    open_folder,
    parse_entry_name,
)
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.ledger_tier import LedgerTier
from hybridkv.tiers.memory import byte_view
from hybridkv.tiers.ranking import RankRule
from hybridkv.tiers.transfer import Completion


class DiskTier(LedgerTier):
    """Hit units as files (module docstring)."""

    medium = "DISK"

    def __init__(
        self,
        fingerprint: ModelFingerprint,
        directory: str | os.PathLike[str],
        budget_bytes: int,
        copier: Copier | None = None,
        ranking: RankRule | None = None,
    ) -> None:
        super().__init__(
            fingerprint,
            budget_bytes,
            copier if copier is not None else ThreadCopier("hybridkv-disk-io"),
            ranking,
        )
        self.folder, self._lock_fd = open_folder(Path(directory), fingerprint.hex)
        self._digest = fingerprint.digest
        self._scan()

    def _path(self, key: UnitKey) -> Path:
        return self.folder / entry_name(key)

    def _scan(self) -> None:
        """Adopt the valid entries already in the folder (module docstring)."""
        found: list[tuple[int, str, UnitKey, int]] = []
        for item in os.scandir(self.folder):
            if item.name == LOCK_NAME:
                continue
            if item.name.endswith(TMP_SUFFIX):
                os.unlink(item.path)
                self.stats.leftovers_removed += 1
                continue
            key = parse_entry_name(item.name)
            if key is None or not item.is_file(follow_symlinks=False):
                continue  # not ours: left alone, never served
            try:
                entry_file.read_header(Path(item.path), self._digest, key)
            except CorruptEntryError:
                os.unlink(item.path)
                self.stats.corrupt_removed += 1
                continue
            stat = item.stat(follow_symlinks=False)
            found.append((stat.st_mtime_ns, item.name, key, stat.st_size))
        found.sort()
        with self._lock:
            for tick, (_, _, key, size) in enumerate(found, start=1):
                self._ledger.add_committed(key, size, tick)
            for old in self._ledger.committed_keys():
                if self.used_bytes <= self.budget_bytes:
                    break
                self._ledger.remove(old)
                self._drop(old)  # type: ignore[arg-type]
                self.stats.evictions += 1

    def _measure(self, key: UnitKey, parts: Parts) -> tuple[int, tuple[int, ...]]:
        if not isinstance(key.block_hash, bytes) or not 0 < len(key.block_hash) < 1 << 16:
            raise ValueError(f"block_hash must be 1 to 65535 bytes, got {key.block_hash!r}")
        if len(parts) >= 1 << 16:
            raise ValueError(f"an entry holds at most 65535 parts, got {len(parts)}")
        sizes = tuple(byte_view(p, f"part {i}").nbytes for i, p in enumerate(parts))
        return entry_file.header_length(key, len(sizes)) + sum(sizes), sizes

    def _begin_store(self, key: UnitKey, parts: Parts, sizes: tuple[int, ...]) -> Completion:
        views = [byte_view(p, f"part {i}") for i, p in enumerate(parts)]
        return self._copier.submit(
            entry_file.write_entry, self._path(key), self._digest, key, views, False
        )

    def _end_store_batch(self) -> None:
        self._copier.submit(self._sync_folder)

    def _sync_folder(self) -> None:
        """Make the batch's renames durable (a failure loses durability, not entries)."""
        try:
            entry_file.fsync_dir(self.folder)
        except OSError as e:
            with self._lock:
                self._warn_once("fsync", f"DISK tier: fsync of {self.folder} failed: {e}")

    def _begin_load(self, key: UnitKey, into: Sequence[Any] | None) -> Completion:
        path, digest = self._path(key), self._digest
        targets = None if into is None else [byte_view(t, f"into[{i}]") for i, t in enumerate(into)]

        def read() -> tuple[Any, ...]:
            parts = entry_file.read_entry(path, digest, key)
            os.utime(path)  # recency survives a restart
            if targets is None:
                return parts
            if tuple(t.nbytes for t in targets) != tuple(p.nbytes for p in parts):
                raise ValueError("into's part sizes differ from the entry's")
            for target, part in zip(targets, parts, strict=True):
                target[:] = part
            return tuple(into or ())

        return self._copier.submit(read)

    def _drop(self, key: UnitKey) -> None:
        self._path(key).unlink(missing_ok=True)

    def _check_storage(self, keys: set[UnitKey]) -> None:
        on_disk: dict[UnitKey, int] = {}
        for item in os.scandir(self.folder):
            key = parse_entry_name(item.name)
            if key is not None:
                on_disk[key] = item.stat(follow_symlinks=False).st_size
        missing = keys - set(on_disk)
        assert not missing, f"committed entries without a file: {missing}"
        for key, size in on_disk.items():
            entry = self._ledger.get(key)
            assert entry is not None, f"a file no entry accounts for: {entry_name(key)}"
            assert entry.nbytes == size, (entry_name(key), entry.nbytes, size)
            mode = os.stat(self._path(key)).st_mode & 0o777
            assert mode == 0o600, f"{entry_name(key)} has mode {oct(mode)}"

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        close_folder(self._lock_fd)
