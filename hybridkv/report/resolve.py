"""What ``hybridkv plan`` accepts as a model: a YAML file, an HF folder, or a name.

Tried in this order:

1. an existing ``.yaml``/``.yml`` file: ``load_layout``;
2. an existing directory (a Hugging Face model folder with ``config.json``)
   or ``.json`` file (the ``config.json`` itself), read by
   ``hybridkv.layouts.hf_import.layout_from_hf_config``;
3. the name of a layout shipped in ``configs/`` (``gemma-3-27b``).

Anything else raises ``ValueError`` saying what was tried and listing the
shipped names. Errors of the layout itself (bad YAML, unknown field) are the
loaders' ``ValueError``s, passed through.
"""

from __future__ import annotations

from pathlib import Path

from hybridkv.layouts import ModelLayout, load_layout, shipped_layout, shipped_names

YAML_SUFFIXES = (".yaml", ".yml")


def _from_hf(path: Path) -> ModelLayout:
    try:
        from hybridkv.layouts.hf_import import layout_from_hf_config
    except ImportError as e:
        raise ValueError(
            f"{path}: reading Hugging Face configs is not available in this build "
            f"({e}); pass a YAML layout or a shipped name"
        ) from None
    layout: ModelLayout = layout_from_hf_config(path)
    return layout


def resolve_layout(target: str) -> ModelLayout:
    """The layout ``target`` names (see the module docstring for the order)."""
    path = Path(target)
    if path.is_file():
        if path.suffix.lower() == ".json":
            return _from_hf(path)
        if path.suffix.lower() not in YAML_SUFFIXES:
            raise ValueError(
                f"{target}: a layout file must end in .yaml or .yml; for a Hugging Face "
                "model pass its config.json or the folder holding it"
            )
        return load_layout(path)
    if path.is_dir():
        return _from_hf(path)
    names = shipped_names()
    if target in names:
        return shipped_layout(target)
    raise ValueError(
        f"no model {target!r}: it is not an existing .yaml/.yml file, not a model "
        f"directory, and not a shipped layout name; shipped: {', '.join(names)}"
    )
