"""The light core: what needs only the core install imports no heavy package.

Each check runs in a fresh interpreter (this test process has torch loaded
already) and fails if a module of an extra shows up in ``sys.modules``. A
lazy import that someone turns back into a top-level one fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from core_paths import CORE_PATHS, HEAVY, SIMULATE

from hybridkv.common.extras import EXTRAS, MissingExtraError, install_command, require


def _heavy_modules_after(code: str, *args: str) -> list[str]:
    script = f"HEAVY = {HEAVY!r}\n" + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_core_paths_import_no_extra() -> None:
    assert _heavy_modules_after(CORE_PATHS) == []


def test_simulate_imports_no_extra(tmp_path: Path) -> None:
    # The replay drives the engine's scheduler and requests: none of them may need torch.
    assert _heavy_modules_after(SIMULATE, str(tmp_path)) == []
    assert (tmp_path / "results.json").is_file()


def test_the_check_sees_a_heavy_import() -> None:
    # The probe itself works: importing the engine does load torch.
    assert "torch" in _heavy_modules_after(
        "import sys, json\nfrom hybridkv.engine import LLM\n"
        "print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))"
    )


def test_missing_extra_names_the_pip_command() -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'hybridkv\[plot\]'") as e:
        require("hybridkv_no_such_module.sub", "plot", "hybridkv plan --plot")
    assert str(e.value).startswith("hybridkv plan --plot needs the 'plot' extra")
    assert isinstance(e.value, ValueError)  # the CLI reports it as a one-line user error
    assert install_command("engine") == "pip install 'hybridkv[engine]'"
    with pytest.raises(ValueError, match="unknown extra"):
        install_command("gpu")


def test_a_broken_dependency_is_not_reported_as_a_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the module asked for (or a parent) counts as missing: a module that
    # is installed but fails to import its own dependency surfaces unchanged.
    (tmp_path / "hybridkv_broken_mod.py").write_text("import hybridkv_missing_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("hybridkv_broken_mod", "engine")
    assert e.value.name == "hybridkv_missing_dep"
    assert not isinstance(e.value, MissingExtraError)


def test_pyproject_declares_the_core_and_every_extra() -> None:
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    core = {
        re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower() for d in meta["project"]["dependencies"]
    }
    assert core == {"pydantic", "pyyaml", "xxhash"}
    extras = meta["project"]["optional-dependencies"]
    assert set(extras) == set(EXTRAS)  # install_command names only extras that exist
    assert "hybridkv[engine]" in extras["demo"] and "hybridkv[engine]" in extras["serve"]
    engine = " ".join(extras["engine"])
    for package in ("torch", "numpy", "transformers", "safetensors", "tqdm", "jinja2", "triton"):
        assert package in engine
    assert extras["plot"] == ["matplotlib>=3.8"] and extras["cpu"] == []
