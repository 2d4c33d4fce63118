"""Every environment variable hybridkv reads, read here and nowhere else.

Each is read when asked (never cached at import), so a test's ``monkeypatch.setenv``
takes effect at the next call. An empty value counts as unset.

- ``HYBRIDKV_KERNEL_BACKEND``: the engine's kernel backend (``torch``, ``triton``,
  ``native``; ``hybridkv.kernels.registry``); default: by device.
- ``HYBRIDKV_CACHE``: root of the caches (converted checkpoints, the C build);
  default ``~/.cache/hybridkv``.
- ``TRITON_INTERPRET``: ``1`` runs Triton kernels in its CPU interpreter (tests).
- ``CC``: the C compiler of the native CPU kernels; default ``cc``.
- ``HYBRIDKV_ROW_COPY``: how the host tier copies a batch of rows on the CPU
  (``hybridkv.tiers.row_copy``): ``native`` (the C row copy; an error where it
  cannot be built), ``numpy`` (numpy's fancy-index copies); default: ``native``
  where it builds, else ``numpy`` with one warning.
- ``MC_LOG_LEVEL``: the Mooncake Store client's log level; hybridkv sets it to
  ``ERROR`` where unset before it loads the client (``quiet_mooncake``), which
  otherwise logs every request to stderr.
- ``HYBRIDKV_API_KEY``: the key ``hybridkv serve`` requires of its callers when
  ``--api-key`` is not given (``Authorization: Bearer KEY``); default: none.

Benchmarks and tools read their own variables (``VLLM_SRC``...); this module is the
library's. Torch-free and import-free: anything may import it.
"""

from __future__ import annotations

import os
from pathlib import Path

KERNEL_BACKEND = "HYBRIDKV_KERNEL_BACKEND"
CACHE = "HYBRIDKV_CACHE"
TRITON_INTERPRET = "TRITON_INTERPRET"
CC = "CC"
API_KEY = "HYBRIDKV_API_KEY"
ROW_COPY = "HYBRIDKV_ROW_COPY"
MOONCAKE_LOG_LEVEL = "MC_LOG_LEVEL"


def _get(name: str) -> str | None:
    return os.environ.get(name) or None


def kernel_backend() -> str | None:
    """``$HYBRIDKV_KERNEL_BACKEND``, or None when unset or empty."""
    return _get(KERNEL_BACKEND)


def cache_root() -> Path:
    """``$HYBRIDKV_CACHE`` (``~`` expanded) if set, else ``~/.cache/hybridkv``."""
    root = _get(CACHE)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "hybridkv"


def triton_interpret() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET`` not 0)."""
    return os.environ.get(TRITON_INTERPRET, "0") not in ("", "0")


def c_compiler() -> str:
    """``$CC``, else ``cc``."""
    return _get(CC) or "cc"


def row_copy() -> str | None:
    """``$HYBRIDKV_ROW_COPY``, or None when unset or empty."""
    return _get(ROW_COPY)


def api_key() -> str | None:
    """``$HYBRIDKV_API_KEY``, or None when unset or empty."""
    return _get(API_KEY)


def quiet_mooncake() -> None:
    """Set ``$MC_LOG_LEVEL`` to ``ERROR`` unless the user set it (before the Mooncake
    client loads: it reads the variable then)."""
    if not _get(MOONCAKE_LOG_LEVEL):
        os.environ[MOONCAKE_LOG_LEVEL] = "ERROR"
