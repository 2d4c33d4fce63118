"""The layouts shipped in the repository's ``configs/`` folder, by name.

``configs/`` is installed as the package data ``hybridkv.configs``; a name such
as ``gemma-3-27b`` resolves to ``configs/gemma-3-27b.yaml``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hybridkv.layouts.layout import ModelLayout
from hybridkv.layouts.yaml_io import LayoutError, load_layout


def configs_dir() -> Path:
    """The folder holding the shipped YAML layouts."""
    return Path(str(resources.files("hybridkv.configs")))


def shipped_names() -> list[str]:
    """Names of all shipped layouts, sorted."""
    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def shipped_layout(name: str) -> ModelLayout:
    """Load the shipped layout called ``name`` (file stem in ``configs/``)."""
    path = configs_dir() / f"{name}.yaml"
    if not path.is_file():
        raise LayoutError(
            f"no shipped layout named {name!r}; shipped: {', '.join(shipped_names())}"
        )
    return load_layout(path)
