"""``DiskTier``: entries as files, their modes, a restart, the budget, salts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tier_factories import fingerprint, key

from hybridkv.core.hashing import BlockHasher
from hybridkv.core.request import Request
from hybridkv.tiers import TierError, UnitKey
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.disk import DiskTier


def disk(path: Path, budget: int = 1 << 20, **kw: object) -> DiskTier:
    return DiskTier(kw.pop("fp", fingerprint()), path, budget, InlineCopier(), **kw)  # type: ignore[arg-type]


def loaded(tier: DiskTier, k: UnitKey) -> list[bytes] | None:
    transfer = tier.load(k)
    if transfer is None or not transfer.wait():
        return None
    return [bytes(p) for p in transfer.result]


def test_store_load_on_the_io_thread(tmp_path: Path) -> None:
    tier = DiskTier(fingerprint(), tmp_path / "cache", 1 << 20)
    assert tier.store(key(1, group=2), [b"k" * 100, b"v" * 100]).wait()
    assert loaded(tier, key(1, group=2)) == [b"k" * 100, b"v" * 100]
    into = [bytearray(100), bytearray(100)]
    transfer = tier.load(key(1, group=2), into=into)
    assert transfer is not None and transfer.wait() and into == [b"k" * 100, b"v" * 100]
    assert loaded(tier, key(1)) is None  # another group: another key
    tier.check_integrity()
    tier.close()


def test_files_are_owner_only(tmp_path: Path) -> None:
    root = tmp_path / "new" / "cache"
    tier = disk(root)
    assert tier.store(key(1), [b"secret prefix"]).wait()
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(root) == 0o700 and mode(tier.folder) == 0o700
    files = list(tier.folder.iterdir())
    assert len(files) == 2 and {mode(f) for f in files} == {0o600}  # the entry and .lock
    tier.check_integrity()  # checks every entry's mode too


def test_a_restart_serves_what_was_stored(tmp_path: Path) -> None:
    tier = disk(tmp_path)
    for i in range(5):
        assert tier.store(key(i), [bytes([i]) * (i + 1)]).wait()
    used = tier.used_bytes
    path = lambda i: tier.folder / f"g0-{key(i).block_hash.hex()}.unit"  # noqa: E731
    for i in range(5):  # distinct use times: key 0 oldest ... key 4 newest
        os.utime(path(i), ns=(10**18 + i * 10**9,) * 2)
    assert loaded(tier, key(0)) == [bytes([0])]  # a load touches the file: key 0 is newest now
    assert path(0).stat().st_mtime_ns > path(4).stat().st_mtime_ns
    tier.close()
    again = disk(tmp_path)
    assert sorted(again.keys()) == sorted(key(i) for i in range(5)) and again.used_bytes == used
    assert all(loaded(again, key(i)) == [bytes([i]) * (i + 1)] for i in range(1, 5))
    again.check_integrity()
    again.close()
    for i in range(5):
        os.utime(path(i), ns=(10**18 + ((i + 4) % 5) * 10**9,) * 2)  # key 1 oldest, key 0 newest
    # A smaller budget on restart evicts the least recently used first: key 1 only.
    small = disk(tmp_path, budget=used - 1)
    assert sorted(small.keys()) == sorted(key(i) for i in (0, 2, 3, 4))
    assert small.stats.evictions == 1 and not path(1).exists()
    small.check_integrity()


def test_one_process_per_folder(tmp_path: Path) -> None:
    tier = disk(tmp_path)
    with pytest.raises(TierError, match="in use by another process"):
        disk(tmp_path)
    tier.close()
    disk(tmp_path).close()


def test_the_budget_counts_whole_files(tmp_path: Path) -> None:
    tier = disk(tmp_path, budget=400)
    for i in range(4):
        assert tier.store(key(i), [bytes(100)]).wait()
        tier.check_integrity()
    assert tier.used_bytes <= 400 and tier.stats.evictions >= 1
    on_disk = sum(p.stat().st_size for p in tier.folder.glob("*.unit"))
    assert on_disk == tier.used_bytes


def test_a_salted_entry_never_hits_for_another_salt(tmp_path: Path) -> None:
    # The salt enters block 0's hash and the chain carries it: every key differs.
    hasher = BlockHasher(16)
    prompt = list(range(64))

    def keys(salt: str | None) -> list[UnitKey]:
        hashes: list[bytes] = []
        hasher.extend(hashes, prompt, keys=Request("r", prompt, cache_salt=salt))
        return [UnitKey(h, 0) for h in hashes]

    tier = disk(tmp_path)
    for k in keys("tenant-a"):
        assert tier.store(k, [b"kv of tenant a"]).wait()
    tier.close()
    tier = disk(tmp_path)  # after a restart too
    assert all(tier.contains(k) for k in keys("tenant-a"))
    assert not any(tier.contains(k) for k in keys("tenant-b") + keys(None))
    assert all(tier.load(k) is None for k in keys("tenant-b"))
