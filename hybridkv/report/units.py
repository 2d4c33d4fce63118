"""Memory sizes in and out, and compact lists of layer indices.

``parse_memory`` reads what a user types for ``--memory``: a plain byte count
(``1073741824``, ``1_000``) or a number with a suffix, decimal (``KB`` ``MB``
``GB`` ``TB``: powers of 1000) or binary (``KiB`` ``MiB`` ``GiB`` ``TiB``:
powers of 1024). Sizes are written by ``hybridkv.common.units.format_bytes``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MEMORY_UNITS: dict[str, int] = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_BY_UPPER = {k.upper(): v for k, v in MEMORY_UNITS.items()}
_MEMORY_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_memory(text: str) -> int:
    """Bytes in ``text`` (``"40GiB"``, ``"80GB"``, ``"512MiB"``, ``"1024"``).

    Suffixes are case-insensitive (``gib`` = ``GiB``); a fractional size is
    rounded down to whole bytes. Raises ``ValueError`` naming the accepted
    suffixes for anything else, and for sizes below one byte.
    """
    accepted = ", ".join(MEMORY_UNITS)
    m = _MEMORY_RE.match(text)
    unit = _BY_UPPER.get(m.group(2).upper() or "B") if m else None
    if m is None or unit is None:
        raise ValueError(
            f"cannot read memory size {text!r}: give a byte count or a number with "
            f"one of the suffixes {accepted} (e.g. 40GiB, 80GB, 512MiB)"
        )
    try:
        value = int(Decimal(m.group(1).replace("_", "")) * unit)
    except InvalidOperation:
        raise ValueError(f"cannot read the number in memory size {text!r}") from None
    if value < 1:
        raise ValueError(f"memory size {text!r} is less than one byte")
    return value


def layer_index(name: str) -> int | None:
    """The index in a ``layers.{i}`` name (``None`` for other names)."""
    head, _, tail = name.rpartition(".")
    return int(tail) if head == "layers" and tail.isdigit() else None


def compact_indices(indices: list[int]) -> str:
    """Sorted indices with runs of 3+ joined: ``[0,1,2,3,4,6,7]`` -> ``"0-4,6,7"``."""
    parts: list[str] = []
    values = sorted(indices)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{values[i]}-{values[j]}")
        else:
            parts.extend(str(v) for v in values[i : j + 1])
        i = j + 1
    return ",".join(parts)


def compact_layers(names: tuple[str, ...] | list[str]) -> str:
    """Layer names as compact indices (names not of the ``layers.i`` form kept)."""
    indices = [layer_index(n) for n in names]
    known = [i for i in indices if i is not None]
    other = [n for n, i in zip(names, indices, strict=True) if i is None]
    return ",".join(p for p in (compact_indices(known), *other) if p)


def plural(n: int, word: str) -> str:
    """``"1 buffer"``, ``"10 buffers"``, ``"1,024 layers"``."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
