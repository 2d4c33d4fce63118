"""One tier entry: header, part sizes, payload; as a disk-tier file, written atomically.

The same bytes are a store-tier object (``store_tier.py``): ``entry_header`` +
the parts, checked by ``check_entry`` on every load.

::

    offset  size  field
    0       8     magic b"HKVUNIT\\0"
    8       2     format version (1)
    10      2     number of parts
    12      4     group id
    16      2     block hash length (h)
    18      2     0 (reserved)
    20      8     payload length (sum of the parts)
    28      32    model fingerprint digest
    60      16    checksum: xxh3-128 of every other byte of the file
    76      h     block hash
    76+h    8*n   part sizes
    ...           the parts, back to back

All integers little-endian. The checksum covers the header (but itself) and
the payload, so any flipped byte is found; the header alone (no payload read)
is checked on a restart, the checksum on every load.

Writing: a temporary file in the same folder (``.NAME.PID.N.tmp``, mode 0600,
``O_EXCL``), every byte written, ``fsync``, then ``os.replace`` onto the final
name and ``fsync`` of the folder (once per batch of entries). A writer killed midway leaves only a
temporary file (never a final name with missing bytes); ``DiskTier`` removes
those when it starts.
"""

from __future__ import annotations

import errno
import itertools
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import xxhash

from hybridkv.tiers.base import CorruptEntryError, TierFullError, UnitKey

MAGIC = b"HKVUNIT\0"
VERSION = 1
_FIXED = struct.Struct("<8sHHIHHQ32s16s")  # up to and including the checksum
_CHECKSUM_AT = 60
_SIZE = struct.Struct("<Q")
_counter = itertools.count()


def header_length(key: UnitKey, nparts: int) -> int:
    """The header's length for ``key`` and ``nparts`` parts."""
    return _FIXED.size + len(key.block_hash) + _SIZE.size * nparts


def _header(digest: bytes, key: UnitKey, sizes: Sequence[int], checksum: bytes) -> bytes:
    fixed = _FIXED.pack(
        MAGIC,
        VERSION,
        len(sizes),
        key.group_id,
        len(key.block_hash),
        0,
        sum(sizes),
        digest,
        checksum,
    )
    return fixed + key.block_hash + b"".join(_SIZE.pack(s) for s in sizes)


def _checksum(header: bytes, parts: Sequence[memoryview | bytes]) -> bytes:
    h = xxhash.xxh3_128()
    h.update(header[:_CHECKSUM_AT])
    h.update(header[_CHECKSUM_AT + 16 :])
    for part in parts:
        h.update(part)
    return h.digest()


def entry_header(digest: bytes, key: UnitKey, parts: Sequence[memoryview]) -> bytes:
    """The header of an entry of ``parts`` (checksum included): the entry is this
    header followed by the parts (the disk tier's files, the store tier's objects)."""
    sizes = [p.nbytes for p in parts]
    blank = _header(digest, key, sizes, bytes(16))
    return _header(digest, key, sizes, _checksum(blank, parts))


def write_all(fd: int, data: memoryview | bytes) -> None:
    """``os.write`` until every byte is written (a test replaces it to inject errors)."""
    view = memoryview(data)
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]


def write_entry(
    path: Path, digest: bytes, key: UnitKey, parts: Sequence[memoryview], sync_folder: bool = True
) -> None:
    """Write ``parts`` as ``path``, atomically (module docstring). ``ENOSPC`` /
    ``EDQUOT`` become ``TierFullError``; nothing is left behind on any error.
    ``sync_folder=False``: the caller fsyncs the folder once after a batch."""
    header = entry_header(digest, key, parts)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_counter)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            write_all(fd, header)
            for part in parts:
                write_all(fd, part)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TierFullError(e.errno, f"disk full writing {path.name}: {e.strerror}") from e
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_folder:
        fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_header(
    data: bytes | memoryview, digest: bytes, key: UnitKey, file_size: int
) -> tuple[int, ...]:
    """The part sizes of an entry whose first bytes are ``data``; ``CorruptEntryError``
    unless the header names ``digest`` and ``key`` and the file has its length."""
    if len(data) < _FIXED.size:
        raise CorruptEntryError(f"entry cut short ({file_size} bytes)")
    magic, version, nparts, group, hash_len, _, payload, found, _ = _FIXED.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptEntryError(
            f"not a version-{VERSION} entry (magic {magic!r}, version {version})"
        )
    if found != digest:
        raise CorruptEntryError("entry of another model fingerprint")
    end = _FIXED.size + hash_len + _SIZE.size * nparts
    if len(data) < end:
        raise CorruptEntryError(f"entry cut short in its header ({file_size} bytes)")
    block_hash = data[_FIXED.size : _FIXED.size + hash_len]
    if group != key.group_id or block_hash != key.block_hash:
        raise CorruptEntryError("entry header names another key than its file name")
    sizes = tuple(s for (s,) in _SIZE.iter_unpack(data[_FIXED.size + hash_len : end]))
    if sum(sizes) != payload or end + payload != file_size:
        raise CorruptEntryError(f"entry of {file_size} bytes, header says {end + payload}")
    return sizes


def read_header(path: Path, digest: bytes, key: UnitKey) -> tuple[int, ...]:
    """Check ``path``'s header only (a restart's scan); its part sizes."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_FIXED.size)
        if len(head) == _FIXED.size:
            (nparts,) = struct.unpack_from("<H", head, 10)
            (hash_len,) = struct.unpack_from("<H", head, 16)
            head += f.read(hash_len + _SIZE.size * nparts)
    return parse_header(head, digest, key, size)


def read_entry(path: Path, digest: bytes, key: UnitKey) -> tuple[memoryview, ...]:
    """``path``'s parts (read-only views of one read) after checking its header and
    checksum (``CorruptEntryError``)."""
    return check_entry(path.read_bytes(), digest, key, path.name)


def check_entry(
    data: bytes | memoryview, digest: bytes, key: UnitKey, name: str = "an entry"
) -> tuple[memoryview, ...]:
    """The parts of a whole entry ``data`` (views of it, read-only for ``bytes``) after
    checking its header and checksum (``CorruptEntryError``, naming ``name``)."""
    view = memoryview(data)
    sizes = parse_header(view, digest, key, view.nbytes)
    start = view.nbytes - sum(sizes)
    header = bytes(view[:start])
    if _checksum(header, [view[start:]]) != header[_CHECKSUM_AT : _CHECKSUM_AT + 16]:
        raise CorruptEntryError(f"checksum mismatch in {name}")
    out = []
    for size in sizes:
        out.append(view[start : start + size])
        start += size
    return tuple(out)
