"""Reading layouts from YAML, with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hybridkv.layouts.kinds import KIND_NAMES
from hybridkv.layouts.layout import ModelLayout


class LayoutError(ValueError):
    """A layout file or mapping that does not describe a valid model."""


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _field_path(raw: tuple[Any, ...]) -> tuple[Any, ...]:
    """``raw`` without pydantic's union-branch tags, keeping real field names.

    A kind tag ("sliding_window", "mamba1"...) follows a union marker
    ("tagged-union[...]") or a ``layer_kinds`` key; elsewhere the same word is a
    field (``layers[2].sliding_window``) and stays.
    """
    out: list[Any] = []
    after_branch = False
    for i, p in enumerate(raw):
        if isinstance(p, str) and ("[" in p or p == "str"):
            after_branch = True
            continue
        is_tag = after_branch or (i == 2 and raw[0] == "layer_kinds")
        after_branch = False
        if is_tag and isinstance(p, str) and p in KIND_NAMES:
            continue
        out.append(p)
    return tuple(out)


def _explain(err: ValidationError, where: str) -> LayoutError:
    lines = [f"{where}: invalid layout"]
    for e in err.errors(include_url=False):
        raw = e["loc"]
        if "str" in raw and not isinstance(e.get("input"), str):
            continue  # a mapping given where a kind name was also allowed
        loc = _field_path(raw)
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"  {_format_loc(loc)}: {msg}{shown}")
    return LayoutError("\n".join(lines))


def layout_from_dict(data: Any, where: str = "<dict>") -> ModelLayout:
    """Validate a mapping as a layout; ``where`` prefixes error messages."""
    if not isinstance(data, dict):
        raise LayoutError(f"{where}: a layout must be a mapping, got {type(data).__name__}")
    try:
        return ModelLayout.model_validate(data)
    except ValidationError as e:
        raise _explain(e, where) from None


def load_layout(path: str | Path) -> ModelLayout:
    """Read and validate one YAML layout file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise LayoutError(f"{path}: cannot read layout file ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise LayoutError(f"{path}: not valid YAML: {e}") from None
    return layout_from_dict(data, str(path))


def dump_layout(layout: ModelLayout) -> str:
    """The layout as YAML (round-trips through ``load_layout``)."""
    data = layout.model_dump(mode="json", exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False)
