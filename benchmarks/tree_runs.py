"""Fresh processes of a benchmark script, alternating between checkouts (``--compare``).

Each run imports the ``hybridkv`` of its tree (first on ``PYTHONPATH``) and prints its
result as JSON on its last line; trees take turns, so drift on a shared machine hits
all alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def alternate(
    script: Path,
    trees: dict[str, Path],
    args: list[str],
    rounds: int,
    note: Callable[[int, str, dict[str, Any]], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` x every tree in turn: ``script *args --json`` with that tree's
    ``hybridkv``; each run's JSON per tree, in order. ``note(round, tree, result)``
    is told of each run as it ends."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for r in range(rounds):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree))
            cmd = [sys.executable, str(script), *args, "--json"]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            if note is not None:
                note(r, name, runs[name][-1])
    return runs
