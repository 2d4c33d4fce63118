"""A disk tier's folder: created owner-only, checked writable, locked by one process.

``<disk_cache_dir>/<fingerprint hex[:32]>/`` holds one model fingerprint's
entries (``g<group>-<block hash hex>.unit``) and a ``.lock`` file that the
tier holds with ``flock`` while it lives, so that two processes never manage
the same entries. Folders are created with mode 0700 and files with 0600
(readable by their owner only: a cache entry reveals that someone sent that
prefix). A folder that cannot be created or written is a ``TierError`` naming
``disk_cache_dir`` and the fix (the CLI prints it as one line, exit 2).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from hybridkv.tiers.base import TierError, UnitKey

SUFFIX = ".unit"
TMP_SUFFIX = ".tmp"
LOCK_NAME = ".lock"


def entry_name(key: UnitKey) -> str:
    return f"g{key.group_id}-{key.block_hash.hex()}{SUFFIX}"


def parse_entry_name(name: str) -> UnitKey | None:
    """The key of an entry file name, or None for any other name."""
    if not name.endswith(SUFFIX) or not name.startswith("g"):
        return None
    group, sep, digest = name[1 : -len(SUFFIX)].partition("-")
    if not sep or not group.isdigit():
        return None
    try:
        return UnitKey(bytes.fromhex(digest), int(group))
    except ValueError:
        return None


def _probe_write(folder: Path) -> None:
    """Create and remove a file in ``folder`` (raises ``OSError`` if it cannot)."""
    probe = folder / f".probe.{os.getpid()}{TMP_SUFFIX}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    probe.unlink()


def _unusable(root: Path, e: OSError) -> TierError:
    why = e.strerror or type(e).__name__
    return TierError(
        f"disk_cache_dir {str(root)!r} is not a writable directory ({why}); "
        "give a directory this user can create and write, or fix its permissions"
    )


def check_writable(root: Path) -> None:
    """Create ``root`` (0700) if missing and check that files can be made in it:
    ``TierError`` naming ``disk_cache_dir`` if not (checked at start, before any load)."""
    try:
        if not root.exists():
            root.mkdir(mode=0o700, parents=True)
            os.chmod(root, 0o700)
        if not root.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(root))
        _probe_write(root)
    except OSError as e:
        raise _unusable(root, e) from e


def open_folder(root: Path, fingerprint_hex: str) -> tuple[Path, int]:
    """Create (0700) and lock the fingerprint's folder under ``root``: ``(folder,
    lock fd)``. ``TierError`` if it cannot be written or another process holds it."""
    folder = root / fingerprint_hex[:32]
    check_writable(root)
    try:
        if not folder.exists():
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)  # exact, whatever the umask
        if not folder.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(folder))
        _probe_write(folder)
        lock_fd = os.open(
            folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600
        )
    except OSError as e:
        raise _unusable(root, e) from e
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(lock_fd)
        raise TierError(
            f"disk_cache_dir {str(root)!r} is in use by another process (it holds "
            f"{folder / LOCK_NAME}: {e.strerror}); give each server its own disk_cache_dir"
        ) from e
    return folder, lock_fd


def close_folder(lock_fd: int) -> None:
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    os.close(lock_fd)
