"""Results files whose prose is written by hand and whose tables a script regenerates."""

from __future__ import annotations

from pathlib import Path

MARKER = "<!-- tables -->"


def write_tables(path: Path, lines: list[str]) -> None:
    """Write ``lines`` after ``MARKER`` in ``path``, keeping the prose before it (a new
    file: the marker and the tables only)."""
    text = path.read_text() if path.exists() else ""
    head = text.split(MARKER)[0].rstrip() + "\n\n" if text else ""
    path.write_text(head + MARKER + "\n\n" + "\n".join(lines) + "\n")


def emit(path: Path, lines: list[str], write: bool) -> None:
    """Print ``lines``; with ``write``, also into ``path`` (``write_tables``)."""
    print("\n".join(lines))
    if write:
        write_tables(path, lines)
        print(f"wrote {path.parent.name}/{path.name}")
