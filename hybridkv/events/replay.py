"""``ReplayBuffer``: the last N published batches, by sequence number.

The publisher numbers batches 0, 1, 2, ... as it sends them and keeps the
newest ``capacity`` payloads here; a subscriber that saw a gap in the numbers
asks the replay socket for everything from a given number on. Batches older
than the buffer are gone: a replay starts at the oldest one kept.

Invariants (``check_integrity``): at most ``capacity`` entries; their numbers
are consecutive and the last is ``next_seq - 1``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator


class ReplayBuffer:
    """Numbers payloads as they are appended and keeps the newest ``capacity``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.next_seq = 0
        self._entries: deque[tuple[int, bytes]] = deque(maxlen=capacity)

    def append(self, payload: bytes) -> int:
        """Keep ``payload`` under the next sequence number (dropping the oldest); returns it."""
        seq = self.next_seq
        self._entries.append((seq, payload))
        self.next_seq = seq + 1
        return seq

    def since(self, start_seq: int) -> Iterator[tuple[int, bytes]]:
        """Kept ``(seq, payload)`` with ``seq >= start_seq``, oldest first. Read-only."""
        entries = self._entries
        if not entries:
            return iter(())
        skip = max(0, start_seq - entries[0][0])
        return (entries[i] for i in range(skip, len(entries)))

    def __len__(self) -> int:
        return len(self._entries)

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring."""
        entries = self._entries
        assert len(entries) <= self.capacity, "buffer over capacity"
        seqs = [s for s, _ in entries]
        assert seqs == list(range(self.next_seq - len(seqs), self.next_seq)), (
            f"sequence numbers not consecutive up to {self.next_seq - 1}: {seqs[:3]}..."
        )
