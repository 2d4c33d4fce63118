"""Build and load the native CPU kernels (``csrc/*.c``) once per machine.

``library()`` compiles the C sources into one library with the system C compiler
(``$CC``, else ``cc``) as ``-O3 -march=native -fopenmp -shared`` into
``~/.cache/hybridkv/kernels/`` (``$HYBRIDKV_CACHE`` overrides the root),
keyed by a hash of the sources, the flags, the compiler's version and this
CPU's feature flags, so an edit or another machine rebuilds instead of loading
a stale or illegal binary. The build takes about a second; later processes
load the cached file. The library links the same ``libgomp.so.1`` that torch
loads, so its OpenMP threads are torch's.

A missing compiler or a failed build raises ``NativeBuildError`` with the
compiler's output; ``native_status()`` reports the same without raising.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from hybridkv.common import env

SOURCES = tuple(sorted((Path(__file__).with_name("csrc")).glob("*.c")))
FLAGS = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=gnu11",
)


class NativeBuildError(RuntimeError):
    """The native CPU kernels cannot be built or loaded here."""


def _compiler() -> str:
    cc = env.c_compiler()
    path = shutil.which(cc)
    if path is None:
        raise NativeBuildError(
            f"the native CPU kernels need a C compiler with OpenMP; {cc!r} was not found "
            "(install gcc, or set CC)"
        )
    return path


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    return env.cache_root() / "kernels"


def _build(cc: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [cc, *FLAGS, "-o", str(out), *map(str, SOURCES), "-lm"]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise NativeBuildError(
                f"building the native CPU kernels failed ({' '.join(cmd)}):\n{run.stderr}"
            )
        os.replace(out, target)  # atomic: concurrent builders never load a partial file


def _library_path(cc: str) -> Path:
    """Where the build for this source, these flags, compiler and CPU lives."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    parts = (*(s.read_text() for s in SOURCES), " ".join(FLAGS), version, _cpu_flags())
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return _cache_dir() / f"hybridkv_cpu-{key}.so"


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded native kernel library (built on first use; see the module docstring)."""
    if platform.system() != "Linux":
        raise NativeBuildError(
            f"the native CPU kernels are built for Linux only, not {platform.system()}"
        )
    cc = _compiler()
    target = _library_path(cc)
    if not target.exists():
        _build(cc, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeBuildError(f"loading {target} failed: {exc}") from exc


def native_status() -> str | None:
    """None when the native kernels load here, else why not (one line)."""
    try:
        library()
    except NativeBuildError as exc:
        return str(exc).splitlines()[0]
    return None
