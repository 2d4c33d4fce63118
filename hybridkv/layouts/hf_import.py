"""Import a ``ModelLayout`` from a local Hugging Face ``config.json``.

``layout_from_hf_config`` reads a model directory, a ``config.json`` path or a
``transformers.PretrainedConfig`` (never the network: ``local_files_only``),
unwraps multimodal wrappers (Gemma 3, Llama 4: their ``text_config``) and asks
the family's reader (``hf_families``) for one layer kind per layer. The result
is compact: each distinct kind is named once under ``layer_kinds`` and the
layers become a repeated ``pattern`` when the model is periodic, an explicit
``layers`` list otherwise, so ``dump_layout`` gives a readable YAML file.

Supported ``model_type`` values: ``SUPPORTED_MODEL_TYPES``. Anything else raises
``LayoutError`` (a ``ValueError``) that lists them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hybridkv.common.user_errors import one_line
from hybridkv.layouts.hf_families import READERS, SUPPORTED_MODEL_TYPES, WRAPPERS, HFConfig
from hybridkv.layouts.kinds import LayerKind
from hybridkv.layouts.layout import ModelLayout
from hybridkv.layouts.yaml_io import LayoutError, layout_from_dict

DEFAULT_CACHE_DTYPE = "bfloat16"
# A config's float dtype (torch's spellings, as str(torch.dtype) or a name) -> cache dtype.
_FLOAT_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}

_KIND_BASE_NAMES = {
    "full": "full",
    "sliding_window": "sliding",
    "chunked_local": "chunked",
    "mamba1": "mamba",
    "mamba2": "mamba",
    "none": "none",
}


def layout_from_hf_config(
    path_or_config: str | os.PathLike[str] | HFConfig,
    *,
    name: str | None = None,
    cache_dtype: str | None = None,
    max_model_len: int | None = None,
) -> ModelLayout:
    """The layout of a Hugging Face model, from its config alone (no weights, offline).

    ``path_or_config``: a directory holding ``config.json``, the path of a
    ``config.json``, or a ``PretrainedConfig``. Defaults: ``name`` is the
    directory name (else the config's ``model_type``); ``cache_dtype`` is the
    config's ``dtype``/``torch_dtype`` when it is a float type, else bfloat16;
    ``max_model_len`` is the text config's ``max_position_embeddings``.
    """
    if isinstance(path_or_config, str | os.PathLike):
        config, where = _load(Path(path_or_config))
        default_name = where.parent.name
        source: str | None = str(where)
    else:
        config = path_or_config
        if not hasattr(config, "model_type"):
            raise LayoutError(
                f"path_or_config: expected a model directory, a config.json path or a "
                f"transformers PretrainedConfig, got {type(config).__name__}"
            )
        source = getattr(config, "name_or_path", None) or None
        default_name = Path(source).name if source else ""
    text = _text_config(config)
    kinds = READERS[text.model_type](text)
    return _build(
        name=name or default_name or text.model_type,
        source=source,
        cache_dtype=cache_dtype or _config_dtype(text, config),
        max_model_len=max_model_len or _max_position_embeddings(text),
        kinds=kinds,
    )


def _load(path: Path) -> tuple[HFConfig, Path]:
    """Read ``path`` (a directory or a config.json) with transformers' AutoConfig."""
    hint = "give a model directory holding config.json, or the path of a config.json"
    if not path.exists():
        raise LayoutError(f"{path}: no such directory or file; {hint}")
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise LayoutError(f"{config_file}: no such file; {hint}")
    raw = _read_json(config_file)
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    _check_supported(model_type, str(config_file))
    return read_hf_config(config_file), config_file


def _read_json(config_file: Path) -> Any:
    try:
        return json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutError(f"{config_file}: not a readable JSON config ({one_line(e)})") from None


def read_hf_config(config_file: Path) -> HFConfig:
    """``config_file`` (a ``config.json``) read by transformers' ``AutoConfig``, offline.

    Any failure is a ``LayoutError`` naming the file, on one line: not JSON,
    not an object, or a field transformers refuses (``"num_hidden_layers":
    "many"``). The model type is not checked here.
    """
    raw = _read_json(config_file)
    if not isinstance(raw, dict):
        raise LayoutError(
            f"{config_file}: a config must be a JSON object, got {type(raw).__name__}"
        )
    from transformers import AutoConfig  # deferred: importing transformers takes seconds

    try:
        return AutoConfig.from_pretrained(str(config_file), local_files_only=True)
    except Exception as e:  # transformers raises many types (strict field validation too)
        raise LayoutError(
            f"{config_file}: transformers cannot read this config ({one_line(e)})"
        ) from e


def _check_supported(model_type: Any, where: str) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise LayoutError(
            f"{where}: model_type {model_type!r} is not supported; supported model types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def _text_config(config: HFConfig) -> HFConfig:
    """The decoder's config: ``text_config`` of a multimodal wrapper, else ``config``."""
    model_type = getattr(config, "model_type", None)
    _check_supported(model_type, f"{type(config).__name__}")
    if model_type not in WRAPPERS:
        return config
    text = getattr(config, "text_config", None)
    if text is None:
        raise LayoutError(f"{model_type} config: 'text_config' is missing")
    if getattr(text, "model_type", None) != WRAPPERS[model_type]:
        raise LayoutError(
            f"{model_type} config: text_config.model_type is "
            f"{getattr(text, 'model_type', None)!r}, expected {WRAPPERS[model_type]!r}"
        )
    return text


def _config_dtype(*configs: HFConfig) -> str:
    """The first float ``dtype``/``torch_dtype`` of ``configs``, else bfloat16."""
    for config in configs:
        value = getattr(config, "dtype", None)
        if value is None and not hasattr(config, "dtype"):
            value = getattr(config, "torch_dtype", None)  # transformers < 5
        # A torch.dtype prints as "torch.bfloat16": no need to import torch to read it.
        name = str(value).removeprefix("torch.") if value is not None else None
        if name in _FLOAT_DTYPES:
            return _FLOAT_DTYPES[name]
    return DEFAULT_CACHE_DTYPE


def _max_position_embeddings(config: HFConfig) -> int:
    value = getattr(config, "max_position_embeddings", None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LayoutError(
            f"{config.model_type} config: max_position_embeddings is {value!r}; pass "
            "max_model_len= to layout_from_hf_config"
        )
    return value


def _build(
    *,
    name: str,
    source: str | None,
    cache_dtype: str,
    max_model_len: int,
    kinds: list[LayerKind],
) -> ModelLayout:
    """A compact layout: named kinds, and a pattern when the layers repeat one."""
    names: dict[LayerKind, str] = {}
    for kind in kinds:
        if kind not in names:
            base = _KIND_BASE_NAMES[kind.kind]
            taken = sum(1 for n in names.values() if n.split("_")[0] == base)
            names[kind] = base if taken == 0 else f"{base}_{taken + 1}"
    entries = [names[k] for k in kinds]
    data: dict[str, Any] = {
        "name": name,
        "source": source,
        "cache_dtype": cache_dtype,
        "max_model_len": max_model_len,
        "layer_kinds": {n: k.model_dump() for k, n in names.items()},
    }
    period = _period(entries)
    if period is not None:
        data.update(pattern=entries[:period], num_layers=len(entries))
    else:
        data["layers"] = entries
    return layout_from_dict(data, where=source or name)


def _period(entries: list[str]) -> int | None:
    """The shortest p that repeats at least twice and regenerates ``entries``.

    Linear time: the shortest period of a sequence is ``n - border``, where
    ``border`` is its longest proper prefix that is also a suffix (KMP's
    prefix function), so layouts of many thousand layers import quickly.
    """
    n = len(entries)
    border = [0] * n
    for i in range(1, n):
        k = border[i - 1]
        while k and entries[i] != entries[k]:
            k = border[k - 1]
        border[i] = k + 1 if entries[i] == entries[k] else k
    p = n - border[-1] if n else 0
    return p if 0 < p <= n // 2 else None
