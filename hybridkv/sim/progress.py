"""A progress line on stderr for ``hybridkv simulate`` (stdlib only, like the whole replay)::

    gemma-3-27b 40 GB lru:  62% 930/1500 req [00:04 elapsed, 00:02 left, 211.3 req/s]

``ProgressLine(total, desc)`` draws it at once; ``update(n)`` counts ``n``
more finished requests and redraws at most every ``min_interval`` seconds;
``close()`` draws the final count and ends the line.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class ProgressLine:
    """Finished requests out of ``total``, redrawn in place (see the module docstring)."""

    def __init__(
        self, total: int, desc: str, stream: TextIO | None = None, min_interval: float = 0.1
    ) -> None:
        self.total, self.desc, self.done = total, desc, 0
        self.stream = sys.stderr if stream is None else stream
        self.min_interval = min_interval
        self.start = self.last_draw = time.monotonic()
        self._draw(self.start)

    def update(self, n: int) -> None:
        """Count ``n`` more finished requests."""
        self.done += n
        now = time.monotonic()
        if now - self.last_draw >= self.min_interval:
            self._draw(now)

    def close(self) -> None:
        """Draw the final count and end the line."""
        self._draw(time.monotonic())
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, now: float) -> None:
        self.last_draw = now
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        remaining = self.total - self.done
        left = _clock(remaining / rate) if rate > 0 else "00:00" if remaining <= 0 else "?"
        share = 100 * self.done // self.total if self.total else 100
        self.stream.write(
            f"\r{self.desc}: {share:3d}% {self.done}/{self.total} req "
            f"[{_clock(elapsed)} elapsed, {left} left, {rate:.1f} req/s]"
        )
        self.stream.flush()
