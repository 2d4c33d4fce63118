"""A bare install: the project with its core dependencies only, in a new venv.

Builds the project's wheel (no build isolation: the test venv's setuptools),
installs it into a fresh venv with pip resolving only ``[project]
dependencies`` (pydantic, pyyaml, xxhash; from the configured index or wheel
folders), then runs there the manager, the planner and ``hybridkv plan``
(``core_paths.CORE_PATHS``) and ``hybridkv simulate`` (``core_paths.SIMULATE``,
whose results must equal this venv's), and checks that what needs an extra
fails with the ``pip install`` command to run. Takes 20-40 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from core_paths import CORE_PATHS, HEAVY, SIMULATE

REPO = Path(__file__).resolve().parents[1]
PACKAGED = ("pyproject.toml", "README.md", "hybridkv", "kernels", "configs")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")

# Run inside the bare venv: each needs the engine extra and must say so.
NEEDS_ENGINE = """
import importlib, json
from hybridkv.common.extras import MissingExtraError
from hybridkv.layouts import shipped_layout
from hybridkv.planning import allocate_kv_cache, plan_kv_cache

errors = []
for attempt in (
    lambda: importlib.import_module("hybridkv.kernels"),
    lambda: __import__("hybridkv.engine", fromlist=["LLM"]).LLM,
    lambda: allocate_kv_cache(plan_kv_cache(shipped_layout("tiny-jamba"), 1 << 22).kv_cache_config),
):
    try:
        attempt()
        errors.append(None)
    except MissingExtraError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""


def _run(cmd: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, check=False, env=env, cwd=cwd
    )


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of a venv holding the project and its core dependencies only."""
    tmp = tmp_path_factory.mktemp("bare")
    # Build from a copy of what the wheel holds, so that setuptools' build/ stays out of the repo.
    src = tmp / "src"
    src.mkdir()
    for name in PACKAGED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=IGNORED)
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp / "dist"
    flags = ["-q", "--no-deps", "--no-build-isolation", "-w", str(dist)]
    wheel = _run([sys.executable, "-m", "pip", "wheel", *flags, str(src)])
    assert wheel.returncode == 0, wheel.stderr
    (built,) = dist.glob("hybridkv-*.whl")
    venv = _run([sys.executable, "-m", "venv", str(tmp / "venv")])
    assert venv.returncode == 0, venv.stderr
    bin_dir = tmp / "venv" / "bin"
    install = _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(built)])
    if install.returncode != 0:
        pip = [str(bin_dir / "python"), "-m", "pip"]
        probe = _run([*pip, "download", "-q", "--no-deps", "-d", str(tmp / "probe"), "pyyaml"])
        if probe.returncode != 0:
            pytest.skip(f"no package index or wheel folder reachable: {probe.stderr[-300:]}")
    assert install.returncode == 0, install.stderr
    return bin_dir


def test_only_the_core_dependencies_are_installed(bare: Path) -> None:
    listed = _run([str(bare / "python"), "-m", "pip", "list", "--format", "json"])
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"hybridkv", "pydantic", "pyyaml", "xxhash"} <= names
    assert not names & {"torch", "numpy", "transformers", "triton", "matplotlib", "jinja2"}


def test_manager_planner_and_plan_run_without_extras(bare: Path, tmp_path: Path) -> None:
    done = _run([str(bare / "python"), "-c", f"HEAVY = {HEAVY!r}\n{CORE_PATHS}"], cwd="/")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    plan = _run([str(bare / "hybridkv"), "plan", "tiny-jamba", "--memory", "64MiB"], cwd="/")
    assert plan.returncode == 0, plan.stderr
    assert "Capacity" in plan.stdout
    figure = str(tmp_path / "never-written.png")
    plot = _run(
        [str(bare / "hybridkv"), "plan", "tiny-jamba", "--memory", "64MiB", "--plot", figure]
    )
    assert plot.returncode == 2
    assert plot.stderr.strip().endswith("pip install 'hybridkv[plot]'"), plot.stderr


def _simulate_results(python: str, folder: Path) -> list[dict]:
    """``SIMULATE``'s results run by ``python`` in ``folder``, without the wall time."""
    folder.mkdir()
    done = _run([python, "-c", f"HEAVY = {HEAVY!r}\n{SIMULATE}", str(folder)], cwd="/")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    results: list[dict] = json.loads((folder / "results.json").read_text())
    for r in results:
        del r["replay_seconds"], r["trace"]
    return results


def test_simulate_runs_without_extras_and_gives_the_same_results(
    bare: Path, tmp_path: Path
) -> None:
    # Without numpy or tqdm too (the bare venv has neither), figures identical to
    # this venv's, which has every extra.
    here = _simulate_results(sys.executable, tmp_path / "here")
    assert _simulate_results(str(bare / "python"), tmp_path / "bare") == here
    trace = str(tmp_path / "here" / "trace.jsonl")
    simulate = [str(bare / "hybridkv"), "simulate", "tiny-jamba", "--trace", trace]
    cli = _run([*simulate, "--memory", "4MiB", "--active-params", "1e9"], cwd="/")
    assert cli.returncode == 0, cli.stderr
    assert "tiny-jamba" in cli.stdout and "7/7 req" in cli.stderr  # the progress line
    figure = str(tmp_path / "never-written.png")
    plot = _run([*simulate, "--memory", "4MiB,8MiB", "--plot", figure], cwd="/")
    assert plot.returncode == 2
    assert plot.stderr.strip().endswith("pip install 'hybridkv[plot]'"), plot.stderr


def test_what_needs_an_extra_names_the_pip_command(bare: Path) -> None:
    done = _run([str(bare / "python"), "-c", NEEDS_ENGINE], cwd="/")
    assert done.returncode == 0, done.stderr
    errors = json.loads(done.stdout.splitlines()[-1])
    assert len(errors) == 3
    for error in errors:
        assert error is not None and error.endswith("pip install 'hybridkv[engine]'"), error
    for argv, extra in (
        (["generate", "model", "--prompt", "hi"], "engine"),
        (["demo"], "demo"),
    ):
        cli = _run([str(bare / "hybridkv"), *argv], cwd="/")
        assert cli.returncode == 2, cli.stderr
        assert cli.stderr.startswith(f"hybridkv {argv[0]}: error: hybridkv {argv[0]} needs")
        assert cli.stderr.strip().endswith(f"pip install 'hybridkv[{extra}]'"), cli.stderr
