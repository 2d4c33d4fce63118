"""Saving a run's outcomes (JSON beside the report), to re-render it later."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .mutant import Mutant
from .run import Clean, Outcome


def save(
    path: Path,
    outcomes: list[Outcome],
    clean: dict[tuple[str, ...], Clean],
    seconds: float,
    jobs: int,
    only: str,
    commit: str,
    select: bool,
) -> None:
    data: dict[str, Any] = {"seconds": seconds, "jobs": jobs, "only": only, "commit": commit}
    data["select"] = select
    data["clean"] = [{"tests": list(k), "seconds": c.seconds} for k, c in clean.items()]
    data["outcomes"] = [
        {**asdict(o.mutant), "status": o.status, "test": o.test, "run_seconds": o.seconds}
        for o in outcomes
    ]
    path.write_text(json.dumps(data, indent=1) + "\n")


def load(
    path: Path,
) -> tuple[list[Outcome], dict[tuple[str, ...], Clean], float, int, str, str, bool]:
    """A saved run; runs saved before selection existed ran whole sets (``select`` False)."""
    data = json.loads(path.read_text())
    outcomes = []
    for row in data["outcomes"]:
        status, test, seconds = row.pop("status"), row.pop("test"), row.pop("run_seconds")
        row["tests"] = tuple(row["tests"])
        outcomes.append(Outcome(Mutant(**row), status, test, seconds))
    clean = {tuple(c["tests"]): Clean(c["seconds"], {}) for c in data["clean"]}
    select = bool(data.get("select", False))
    return outcomes, clean, data["seconds"], data["jobs"], data["only"], data["commit"], select
