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


#: The vector units that change which CPU paths run (``/proc/cpuinfo`` flag -> name).
VECTOR_UNITS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512F",
    "avx512_bf16": "AVX512-BF16",
    "amx_bf16": "AMX-BF16",
}


def cpu_features() -> str:
    """The vector units this CPU has and lacks, from ``/proc/cpuinfo``'s flags
    (``AVX2, AVX-512F; no AVX512-BF16, AMX-BF16``); "unknown" where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU features unknown"
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if not flags:
        return "CPU features unknown"
    have = [name for flag, name in VECTOR_UNITS.items() if flag in flags]
    lack = [name for flag, name in VECTOR_UNITS.items() if flag not in flags]
    return ", ".join(have or ["none of " + "/".join(VECTOR_UNITS.values())]) + (
        f"; no {', '.join(lack)}" if lack and have else ""
    )
