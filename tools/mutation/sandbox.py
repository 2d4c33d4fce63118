"""A throw-away copy of the repository in which mutants run.

The repository itself is never written: each worker gets its own copy of the
tracked (and untracked, not ignored) files. Inside the copy, ``.path/hybridkv``
links to the copy's ``hybridkv/``, and ``hybridkv/kernels`` / ``hybridkv/configs``
link to the copy's ``kernels/`` and ``configs/`` (the editable install's
package-dir mapping, see pyproject.toml). With ``.path`` first on ``PYTHONPATH``
the copy's package shadows the editable install (a path entry is searched
before the editable finder), also in subprocesses that tests start, and the
copy's ``kernels/`` does not shadow the hub's ``kernels`` package.
``check_imports`` proves it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def tracked_files(root: Path) -> list[str]:
    """Files git knows or would add (tracked + untracked, not ignored)."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted(f for f in out.split("\0") if f and (root / f).is_file())


def make_sandbox(root: Path, dest: Path) -> Path:
    """Copy the repository's files to ``dest`` and link the import layout."""
    for rel in tracked_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    (dest / "hybridkv" / "kernels").symlink_to(dest / "kernels", target_is_directory=True)
    (dest / "hybridkv" / "configs").symlink_to(dest / "configs", target_is_directory=True)
    (dest / ".path").mkdir()
    (dest / ".path" / "hybridkv").symlink_to(dest / "hybridkv", target_is_directory=True)
    return dest


def sandbox_env(sandbox: Path) -> dict[str, str]:
    """Environment of a worker: the copy first on the path, bytecode caching on
    (pytest's rewritten test modules are cached; the worker gives every source
    write a new mtime, so no .pyc goes stale), one thread per process, the
    no-shrink Hypothesis profile."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(sandbox / ".path")
    env["OMP_NUM_THREADS"] = "1"
    env["HYPOTHESIS_PROFILE"] = "mutation"
    return env


_PROBE = (
    "import os, hybridkv, hybridkv.kernels, hybridkv.configs, hybridkv.engine.scheduler as s\n"
    "print('\\n'.join(os.path.realpath(m.__file__) for m in "
    "(hybridkv, hybridkv.kernels, hybridkv.configs, s)))\n"
    "import importlib.util as u; k = u.find_spec('kernels')\n"
    "print(os.path.realpath(k.origin) if k and k.origin else '-')\n"
)


def check_imports(sandbox: Path) -> None:
    """Raise unless a fresh interpreter imports hybridkv, its kernels and configs
    from the copy, and the copy's ``kernels/`` is not importable as ``kernels``."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=sandbox / "tests",
        env=sandbox_env(sandbox),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    real = str(sandbox.resolve()) + os.sep
    *files, top_level_kernels = out
    bad = [f for f in files if not f.startswith(real)]
    if bad or top_level_kernels.startswith(real):
        raise RuntimeError(f"sandbox {sandbox}: wrong imports: {out}")
