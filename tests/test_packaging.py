"""Every package folder is in ``pyproject.toml``'s explicit package list.

Setuptools installs only the packages it lists (``[tool.setuptools] packages``),
so a new folder left out works in the editable install the tests use and is
missing from a wheel. This checks the list against the tree.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _listed() -> set[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["tool"]["setuptools"]["packages"])


def _folders(root: str, name: str) -> set[str]:
    base = REPO / root
    return {
        ".".join((name, *init.parent.relative_to(base).parts))
        for init in base.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_every_package_folder_is_listed() -> None:
    found = _folders("hybridkv", "hybridkv") | _folders("kernels", "hybridkv.kernels")
    missing = sorted(found - _listed())
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_every_listed_package_exists() -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        roots = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    for name in sorted(_listed()):
        top = max((r for r in roots if name == r or name.startswith(r + ".")), key=len)
        folder = REPO / roots[top] / Path(*name.removeprefix(top).strip(".").split("."))
        assert folder.is_dir(), f"{name} is listed in pyproject.toml but {folder} is missing"
