"""Where a model's files come from: a checkpoint directory or a GGUF file.

``resolve_model_dir(model)`` returns a directory holding ``config.json`` and
safetensors weights. A ``.gguf`` file is converted once (de-quantised, through
transformers' GGUF reader) into a cached checkpoint next to the other
hybridkv caches and reused afterwards. A missing path raises
``FileNotFoundError``; a directory without ``config.json`` raises ``ValueError``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hybridkv.common import env


def cache_root() -> Path:
    """``$HYBRIDKV_CACHE`` or ``~/.cache/hybridkv`` (``hybridkv.common.env``)."""
    return env.cache_root()


def resolve_model_dir(model: str | os.PathLike[str], *, progress: bool = False) -> Path:
    """A checkpoint directory for ``model`` (see the module docstring)."""
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if path.is_file():
        from hybridkv.models.gguf import convert_gguf, is_gguf

        if not is_gguf(path):
            raise ValueError(f"{path} is a file but not a GGUF file; pass a checkpoint directory")
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        out = cache_root() / "gguf" / f"{path.stem}-{key.hexdigest()[:12]}"
        if not (out / "config.json").is_file():
            convert_gguf(path, out, progress=progress)
        return out
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} holds no config.json: not a Hugging Face checkpoint directory")
    return path
