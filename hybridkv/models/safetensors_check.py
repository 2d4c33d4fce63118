"""Checking safetensors files before any weight is read: complete, well-formed headers.

A safetensors file is ``[u64 little-endian n][n bytes of JSON header][tensor data]``,
where every tensor's ``data_offsets`` ``[begin, end)`` lie in the data part and
the last ``end`` is the data size. ``check_safetensors_file`` reads only the
first ``8 + n`` bytes and raises ``CheckpointError`` (a ``ValueError``) naming
the file and what is wrong with it: empty, cut inside its header, holding only
its header, cut inside its data, or a header that is not the format's JSON.
``check_weight_files(model_dir)`` does that for every weight file of a
checkpoint, in well under a millisecond per file, so that a broken checkpoint
is refused before the model is built.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from hybridkv.models.loader import CheckpointError, checkpoint_files

_LENGTH_BYTES = 8
#: The format's own cap on the header (safetensors refuses larger ones).
MAX_HEADER_BYTES = 100_000_000


def _data_end(path: Path, header: Any) -> int:
    """The end of the last tensor's bytes, from a parsed header."""
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]
        ):
            raise CheckpointError(
                f"{path}: the safetensors header entry {name!r} has no valid data_offsets"
            )
        end = max(end, offsets[1])
    return end


def check_safetensors_file(path: Path) -> None:
    """Raise ``CheckpointError`` unless ``path`` is a complete safetensors file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(_LENGTH_BYTES)
            if size == 0:
                raise CheckpointError(f"{path}: the file is empty (0 bytes), not safetensors")
            if len(prefix) < _LENGTH_BYTES:
                raise CheckpointError(
                    f"{path}: {size} bytes is too short for a safetensors file (cut short?)"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{path}: not a safetensors file (its first 8 bytes give a {n:,}-byte header)"
                )
            if _LENGTH_BYTES + n > size:
                raise CheckpointError(
                    f"{path}: the file is cut short inside its header ({size:,} bytes; the "
                    f"header alone needs {_LENGTH_BYTES + n:,})"
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: the safetensors header is not valid JSON") from None
    need = _data_end(path, header)
    data = size - _LENGTH_BYTES - n
    if data == need:
        return
    if data == 0:
        raise CheckpointError(
            f"{path}: the file holds only its header, none of the {need:,} bytes of tensor "
            "data it lists (cut short?)"
        )
    if data < need:
        raise CheckpointError(
            f"{path}: the file is cut short: its header lists {need:,} bytes of tensor data, "
            f"the file holds {data:,}"
        )
    raise CheckpointError(
        f"{path}: {data - need:,} bytes follow the tensor data its header lists (corrupt file)"
    )


def check_weight_files(model_dir: Path) -> list[Path]:
    """Check every safetensors file of ``model_dir``; returns them (``checkpoint_files``)."""
    files = checkpoint_files(model_dir)
    for path in files:
        if not path.is_file():
            raise CheckpointError(f"{path}: listed by the checkpoint but missing")
        check_safetensors_file(path)
    return files
