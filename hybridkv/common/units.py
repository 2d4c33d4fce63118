"""Byte sizes written for people: binary units, optionally with exact bytes."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it >= 1 (``"1.25 MiB"``)."""
    if n < 1024:
        return f"{n:g} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}"
    raise AssertionError("unreachable")


def format_bytes_exact(n: int) -> str:
    """``"1.25 MiB (1,310,720 B)"``; just ``"512 B"`` below one KiB."""
    if n < 1024:
        return f"{n} B"
    return f"{format_bytes(n)} ({n:,} B)"
