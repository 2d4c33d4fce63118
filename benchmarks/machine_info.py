"""The machine line every benchmark result carries (stdlib only: any venv runs it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine() -> str:
    """CPU model name (``/proc/cpuinfo``, else ``platform.processor``), cores, Python."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
