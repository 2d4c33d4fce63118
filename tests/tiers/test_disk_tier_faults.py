"""``DiskTier`` under faults: disk full, flipped bytes, writes cut short, other
models' entries, a folder it cannot write. Nothing wrong is ever served."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tier_factories import fingerprint, key

from hybridkv.tiers import CorruptEntryError, ModelFingerprint, TierError, TierFullError, entry_file
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.disk import DiskTier
from hybridkv.tiers.disk_dir import entry_name

HERE = Path(__file__).resolve().parent


def disk(path: Path, budget: int = 1 << 20, fp: ModelFingerprint | None = None) -> DiskTier:
    return DiskTier(fp or fingerprint(), path, budget, InlineCopier())


def entry_path(tier: DiskTier, i: int) -> Path:
    return tier.folder / entry_name(key(i))


def test_a_budget_too_small_skips_the_store_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tier = disk(tmp_path, budget=150)
    with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
        for i in range(3):
            transfer = tier.store(key(i), [bytes(200)])
            assert not transfer.wait() and isinstance(transfer.error, TierFullError)
    assert len(caplog.records) == 1 and "no room" in caplog.records[0].getMessage()
    assert tier.stats.store_skips == 3 and tier.keys() == [] and not list(tier.folder.glob("*g*"))
    assert tier.store(key(9), [bytes(10)]).wait()  # serving goes on
    tier.check_integrity()


def test_enospc_on_write_skips_the_store_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tier = disk(tmp_path)
    real_write = entry_file.write_all
    writes = {"n": 0}

    def full_after_header(fd: int, data: memoryview | bytes) -> None:
        writes["n"] += 1
        if writes["n"] % 2 == 0:  # the header went out; the device is full for the payload
            os.write(fd, memoryview(data)[:3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)

    monkeypatch.setattr(entry_file, "write_all", full_after_header)
    with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
        failed = [tier.store(key(i), [b"x" * 64]) for i in range(2)]
    assert [t.wait() for t in failed] == [False, False]
    assert all(isinstance(t.error, TierFullError) for t in failed)
    assert len(caplog.records) == 1 and "disk full" in caplog.records[0].getMessage()
    assert tier.stats.store_skips == 2 and tier.used_bytes == 0
    assert sorted(p.name for p in tier.folder.iterdir()) == [".lock"]  # no temporary left
    assert all(tier.load(key(i)) is None for i in range(2))
    monkeypatch.setattr(entry_file, "write_all", real_write)
    assert tier.store(key(5), [b"y" * 64]).wait()
    tier.check_integrity()


def test_another_write_error_is_a_counted_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = disk(tmp_path)

    def eio(fd: int, data: memoryview | bytes) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(entry_file, "write_all", eio)
    transfer = tier.store(key(0), [b"x"])
    assert not transfer.wait() and transfer.error is not None and transfer.error.errno == errno.EIO
    assert tier.stats.store_failures == 1 and tier.keys() == []
    tier.check_integrity()


#: Offsets to flip, from the start (header fields) or, negative, from the end (payload).
FLIPS = {
    "magic": 0,
    "group": 12,
    "digest": 30,
    "checksum": 61,
    "hash": 80,
    "size": 108,
    "payload": -5,
}


@pytest.mark.parametrize("where", sorted(FLIPS))
def test_a_flipped_byte_is_a_miss_and_the_entry_goes(tmp_path: Path, where: str) -> None:
    tier = disk(tmp_path)
    assert tier.store(key(0), [b"K" * 40, b"V" * 40]).wait()
    path = entry_path(tier, 0)
    data = bytearray(path.read_bytes())
    data[FLIPS[where]] ^= 0x01
    path.write_bytes(bytes(data))
    transfer = tier.load(key(0))
    assert transfer is not None and not transfer.wait()
    assert isinstance(transfer.error, CorruptEntryError)
    assert not tier.contains(key(0)) and not path.exists()
    assert tier.stats.corrupt_removed == 1 and tier.stats.load_failures == 1
    tier.check_integrity()


@pytest.mark.parametrize("unpin", ["pin_batch", "pin"])
def test_a_corrupt_entry_still_pinned_goes_when_its_last_pin_does(
    tmp_path: Path, unpin: str
) -> None:
    # The engine's order: a lookup pins the hit's keys (pin_batch), the load settles
    # (inline here) while that batch still holds them, the batch is released after.
    tier = disk(tmp_path)
    assert tier.store(key(0), [b"K" * 40, b"V" * 40]).wait()
    path = entry_path(tier, 0)
    data = bytearray(path.read_bytes())
    data[FLIPS["payload"]] ^= 0x01
    path.write_bytes(bytes(data))
    batch = tier.pin_batch([key(0)]) if unpin == "pin_batch" else None
    if batch is None:
        tier.pin(key(0))
    for failures in (1, 2):  # found again while pinned: fails again, removed once
        transfer = tier.load(key(0))
        assert transfer is not None and not transfer.wait()
        assert isinstance(transfer.error, CorruptEntryError)
        assert path.exists() and tier.stats.load_failures == failures
        tier.check_integrity()  # pinned, so still there, and accounted for
    assert tier.stats.corrupt_removed == 1
    if batch is not None:
        tier.unpin_batch(batch)
    else:
        tier.unpin(key(0))
    assert not tier.contains(key(0)) and not path.exists() and tier.keys() == []
    assert tier.stats.corrupt_removed == 1
    tier.check_integrity()
    assert tier.store(key(0), [b"K" * 40, b"V" * 40]).wait()  # the key can be stored anew
    assert tier.load(key(0)) is not None


def test_a_flipped_header_byte_is_found_on_restart_too(tmp_path: Path) -> None:
    tier = disk(tmp_path)
    for i in range(2):
        assert tier.store(key(i), [b"K" * 40]).wait()
    data = bytearray(entry_path(tier, 1).read_bytes())
    data[12] ^= 0x01  # the group id no longer matches the file name
    entry_path(tier, 1).write_bytes(bytes(data))
    tier.close()
    again = disk(tmp_path)
    assert again.keys() == [key(0)] and again.stats.corrupt_removed == 1
    again.check_integrity()


def test_a_truncated_entry_is_never_served(tmp_path: Path) -> None:
    tier = disk(tmp_path)
    for i in range(3):
        assert tier.store(key(i), [b"K" * 40]).wait()
    for i, cut in ((0, 10), (1, 100)):  # in the header; in the payload
        path = entry_path(tier, i)
        path.write_bytes(path.read_bytes()[:cut])
    transfer = tier.load(key(1))  # found at load time ...
    assert transfer is not None and not transfer.wait()
    tier.close()
    again = disk(tmp_path)  # ... and at a restart
    assert again.keys() == [key(2)] and again.stats.corrupt_removed == 1


KILLED_WRITER = """
import os, sys
from pathlib import Path
from tier_factories import fingerprint, key
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.disk import DiskTier

tier = DiskTier(fingerprint(), Path(sys.argv[1]), 1 << 20, InlineCopier())
assert tier.store(key(0), [b"complete"]).wait()
os.replace = lambda *a: os._exit(9)  # killed after the bytes, before the rename
tier.store(key(1), [b"cut short" * 100])
"""


def test_a_writer_killed_mid_write_leaves_nothing_servable(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 9, done.stderr
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(list(folder.glob("*.tmp"))) == 1  # the killed write's temporary file
    tier = disk(tmp_path)  # the lock died with the process
    assert tier.keys() == [key(0)] and tier.stats.leftovers_removed == 1
    assert tier.load(key(1)) is None and not list(folder.glob("*.tmp"))
    tier.check_integrity()


@pytest.mark.parametrize(
    "other",
    [
        fingerprint(weights="ckpt-b"),
        fingerprint(dtype="float16"),
        fingerprint(layout="hybridkv-unit/v2"),
        fingerprint(block_size=32),
    ],
    ids=["weights", "dtype", "layout", "block_size"],
)
def test_another_models_entries_are_never_a_hit(tmp_path: Path, other: ModelFingerprint) -> None:
    mine = disk(tmp_path)
    assert mine.store(key(0), [b"model a's KV"]).wait()
    mine.close()
    theirs = disk(tmp_path, fp=other)
    assert theirs.keys() == [] and theirs.load(key(0)) is None and not theirs.contains(key(0))
    # Even an entry moved into their folder under the right name is refused (header digest).
    shutil.copy(entry_path(mine, 0), theirs.folder / entry_name(key(0)))
    theirs.close()
    theirs = disk(tmp_path, fp=other)
    assert theirs.keys() == [] and theirs.stats.corrupt_removed == 1
    theirs.close()
    assert disk(tmp_path).keys() == [key(0)]  # the first model's entries are untouched


def test_a_folder_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(
        TierError, match=r"disk_cache_dir '.*file/cache' is not a writable directory"
    ):
        disk(a_file / "cache")

    from hybridkv.tiers import disk_dir

    def denied(folder: Path) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(disk_dir, "_probe_write", denied)
    with pytest.raises(TierError, match=r"not a writable directory \(Permission denied\); give"):
        disk(tmp_path / "ro")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any mode")
def test_a_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(TierError, match="not a writable directory"):
        disk(tmp_path / "ro")
