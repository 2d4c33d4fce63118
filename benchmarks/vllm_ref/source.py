"""vLLM 0.33 from its unpacked source, in this process, with no ``pip install vllm``.

``load_vllm(src, harness)`` runs the shared harness's import recipe
(``../shared/bench/vllm_baseline/vllm_shim.py``: the real scheduler-side KV
cache modules, with the few heavy modules they never use stubbed) and returns
the vLLM names the cache benchmark needs as one namespace.

Run from our own venv, vLLM's import path lacks a few pure dependencies that
ours does not hold (msgspec, cbor2, cloudpickle, regex). When one is missing,
the baseline venv's ``site-packages`` (same Python and torch) is appended to
``sys.path``: after ours, so every package we both have still comes from ours.

Two vLLM modules cannot be imported under the shim (``kv_cache_planning`` and
``core.sched.scheduler`` need the full ``vllm.config``). ``source_functions``
reads named functions (or ``Class.method``) out of such a file with ``ast`` and
executes them in a namespace we give: vLLM's own code runs, nothing is copied.

The shim stubs ``zmq`` and ``uvloop`` under their real top-level names, so that
vLLM imports without them. ``load_vllm`` puts back whichever of the real ones
this Python has once vLLM is imported, and drops the stub of one it has not: a
later ``import zmq`` in the same process (our KV event publisher, a test run after
the cache benchmark's) gets the real module, and ``import uvloop`` (uvicorn's
``loop="auto"``, the server tests) fails as it would have, not a stub that raises
when used.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: Modules the shim replaces by stubs under their real names (``load_vllm``).
SHIMMED_TOP_LEVEL = ("zmq", "uvloop")
DEFAULT_HARNESS = REPO.parent / "shared" / "bench" / "vllm_baseline"
BASELINE_ROOT = Path.home() / ".cache" / "hybridkv-vllm-baseline"
DEFAULT_VLLM_SRC = BASELINE_ROOT / "src" / "vllm-0.33.0"
#: Third-party modules vLLM's scheduler-side import path needs.
VLLM_PURE_DEPS = ("msgspec", "cbor2", "cloudpickle", "regex")


def default_vllm_src() -> Path:
    """``$VLLM_SRC``, else the baseline setup's unpacked vLLM 0.33.0."""
    return Path(os.environ.get("VLLM_SRC", DEFAULT_VLLM_SRC))


def default_harness() -> Path:
    """``$HYBRIDKV_VLLM_HARNESS``, else ``../shared/bench/vllm_baseline``."""
    return Path(os.environ.get("HYBRIDKV_VLLM_HARNESS", DEFAULT_HARNESS))


def _add_baseline_site_packages() -> None:
    missing = [m for m in VLLM_PURE_DEPS if importlib.util.find_spec(m) is None]
    if not missing:
        return
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = BASELINE_ROOT / "venv" / "lib" / ver / "site-packages"
    if not site.is_dir():
        raise RuntimeError(
            f"vLLM needs {', '.join(missing)}, which this Python lacks, and the baseline "
            f"venv ({site}) is absent: run `bash {default_harness()}/setup.sh`"
        )
    sys.path.append(str(site))


def load_vllm(src: Path | None = None, harness: Path | None = None) -> SimpleNamespace:
    """Import vLLM's KV cache manager and friends from ``src`` (once per process)."""
    src = src or default_vllm_src()
    harness = harness or default_harness()
    if not (src / "vllm").is_dir():
        raise FileNotFoundError(
            f"no vLLM source at {src}: run `bash {harness}/setup.sh` (or set VLLM_SRC)"
        )
    if not (harness / "vllm_shim.py").is_file():
        raise FileNotFoundError(f"no vllm_shim.py in {harness} (set HYBRIDKV_VLLM_HARNESS)")
    _add_baseline_site_packages()
    if str(harness) not in sys.path:
        sys.path.insert(0, str(harness))
    import vllm_shim

    real = {}
    for name in SHIMMED_TOP_LEVEL:
        with contextlib.suppress(ImportError):  # not installed here: the stub stays
            real[name] = importlib.import_module(name)
    vllm_shim.install(str(src))
    logging.getLogger("vllm").setLevel(logging.ERROR)

    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils import hashing
    from vllm.utils.math_utils import cdiv
    from vllm.v1 import kv_cache_interface
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import Request, RequestStatus

    # Everything imported later gets the real zmq / uvloop, or none where this Python has
    # none (a stub left behind would pass for installed: uvicorn's loop="auto" takes it).
    for name in SHIMMED_TOP_LEVEL:
        if name in real:
            sys.modules[name] = real[name]
        else:
            sys.modules.pop(name, None)
    return SimpleNamespace(
        version=vllm.__version__,
        src=src,
        KVCacheManager=KVCacheManager,
        Request=Request,
        RequestStatus=RequestStatus,
        SamplingParams=SamplingParams,
        hashing=hashing,
        cdiv=cdiv,
        kv_cache_interface=kv_cache_interface,
        kv_cache_utils=kv_cache_utils,
        MambaAttentionBackendEnum=MambaAttentionBackendEnum,
    )


def source_functions(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> dict:
    """Execute the functions ``names`` of the Python file ``path`` in ``namespace``.

    A name ``"Class.method"`` takes that method out of its class, as a plain
    function (call it with a stand-in ``self``). Returns ``{name: function}``.
    Raises ``RuntimeError`` when a name is not found (vLLM renamed it).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                qual = f"{node.name}.{getattr(item, 'name', '')}"
                if isinstance(item, ast.FunctionDef) and qual in names:
                    item.decorator_list = []
                    found[qual] = item
    absent = [n for n in names if n not in found]
    if absent:
        raise RuntimeError(f"{path}: did not find {', '.join(absent)}")
    out = {}
    for name, node in found.items():
        module = ast.Module(body=[node], type_ignores=[])
        exec(compile(module, str(path), "exec"), namespace)
        out[name] = namespace[node.name]
    return out
