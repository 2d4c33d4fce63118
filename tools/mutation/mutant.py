"""``Mutant``: one small change to one source file, and how to apply it.

A mutant names its file (relative to the repository root), the exact original
text and its replacement. ``start`` is the byte offset of the original in the
file when the generator found it; curated mutants leave it ``None`` and their
original text must occur exactly once in the file (``locate``), so a curated
entry whose code was edited away fails loudly instead of silently testing
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


class MutationError(ValueError):
    """A mutant does not apply to its file (the original text moved or changed)."""


@dataclass(frozen=True)
class Mutant:
    """One mutation. ``key`` identifies it across runs (equivalence notes use it)."""

    file: str
    original: str
    replacement: str
    description: str
    key: str
    line: int = 0
    start: int | None = None  # byte offset of ``original``; None: find it (exactly once)
    tests: tuple[str, ...] = ()  # empty: the tests mapped to the file (targets.py)

    def locate(self, source: bytes) -> int:
        """Byte offset of the original text in ``source``; raises if it is not there
        (or, for a mutant without ``start``, if it is not there exactly once)."""
        old = self.original.encode()
        if self.start is not None:
            if source[self.start : self.start + len(old)] != old:
                raise MutationError(f"{self.key}: original text not at byte {self.start}")
            return self.start
        count = source.count(old)
        if count != 1:
            raise MutationError(
                f"{self.key}: {self.original!r} occurs {count} times in {self.file}, not once"
            )
        return source.index(old)

    def apply(self, source: bytes) -> bytes:
        """``source`` with the original text replaced (see ``locate``)."""
        at = self.locate(source)
        end = at + len(self.original.encode())
        return source[:at] + self.replacement.encode() + source[end:]
