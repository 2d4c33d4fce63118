"""The Markdown report of a mutation run (``benchmarks/results/mutation.md``)."""

from __future__ import annotations

import platform
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .run import Clean, Outcome


@dataclass(frozen=True)
class Summary:
    """Counts of one run. ``rate``: killed / (mutants - equivalent survivors)."""

    total: int
    killed: int
    equivalent: int
    survivors: int  # not argued equivalent
    errors: int

    @property
    def rate(self) -> float:
        judged = self.total - self.equivalent - self.errors
        return self.killed / judged if judged else 1.0


def summarize(outcomes: list[Outcome], equivalent: dict[str, str]) -> Summary:
    """Counts. A mutant not run because it is argued equivalent (status ``equivalent``)
    counts as an equivalent survivor; one whose note has since been removed counts
    as a survivor (it must be run again)."""
    killed = sum(o.status in ("killed", "timeout") for o in outcomes)
    survived = [o for o in outcomes if o.status in ("survived", "equivalent")]
    eq = sum(o.mutant.key in equivalent for o in survived)
    errors = sum(o.status == "error" for o in outcomes)
    return Summary(len(outcomes), killed, eq, len(survived) - eq, errors)


def commit_of(root: Path) -> str:
    """The checked-out commit, marked when the work tree has changes."""
    dirty = " (with uncommitted changes)" if _git(root, "status", "--porcelain") else ""
    return _git(root, "rev-parse", "--short", "HEAD") + dirty


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
    ).stdout.strip()


def render(
    root: Path,
    outcomes: list[Outcome],
    clean: dict[tuple[str, ...], Clean],
    equivalent: dict[str, str],
    seconds: float,
    jobs: int,
    commit: str,
    select: bool,
    check_stale: bool = True,
) -> str:
    """The report: summary, per-file and per-operator tables, survivors with arguments."""
    s = summarize(outcomes, equivalent)
    not_run = sum(o.status == "equivalent" for o in outcomes)
    lines = [
        "# Mutation testing",
        "",
        "`make mutation` (tools/mutation): generated and curated mutants of the core, the",
        "managers, the coordinators, hashing, planning and the scheduler; each runs the tests",
        "mapped to its file (tools/mutation/targets.py) with `-x` in a sandboxed copy.",
        (
            "Selection: only the mapped tests that execute the mutant's statement in a clean "
            "run under per-test coverage (tools/mutation/coverage_map.py)."
            if select
            else "Selection: none (`--no-select`): every mutant ran its whole mapped set."
        ),
        "",
        f"- run at commit {commit}; Python {platform.python_version()}, {jobs} jobs on "
        f"{platform.machine()}; equivalence notes as of {commit_of(root)}",
        f"- runtime {seconds / 60:.1f} min for {s.total} mutants",
        f"- **kill rate {100 * s.rate:.1f}%**: {s.killed} killed of {s.total} mutants, "
        f"{s.equivalent} equivalent survivors (argued below) left out, "
        f"{s.survivors} other survivors, {s.errors} errors",
        f"- {not_run} mutants argued equivalent were not run (`python -m mutation "
        "--recheck-equivalent` runs them too; a killed one would only raise the rate)",
        "",
        "## Test sets (clean run)",
        "",
        "| seconds | tests |",
        "|---:|---|",
    ]
    lines += [f"| {c.seconds:.1f} | {' '.join(k)} |" for k, c in clean.items()]
    lines += ["", "## Per file", "", "| file | mutants | killed | equivalent | survived |"]
    lines.append("|---|---:|---:|---:|---:|")
    by_file: dict[str, Counter[str]] = {}
    for o in outcomes:
        c = by_file.setdefault(o.mutant.file, Counter())
        c["n"] += 1
        c["killed"] += o.status in ("killed", "timeout")
        survived = o.status in ("survived", "equivalent")
        c["eq"] += survived and o.mutant.key in equivalent
        c["surv"] += survived and o.mutant.key not in equivalent
    for f, c in sorted(by_file.items()):
        lines.append(f"| {f} | {c['n']} | {c['killed']} | {c['eq']} | {c['surv']} |")
    ops = Counter(
        o.mutant.description if o.mutant.start is not None else "curated" for o in outcomes
    )
    lines += ["", "Operators: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), ""]
    survivors = [o for o in outcomes if o.status in ("survived", "equivalent")]
    lines += ["## Survivors", ""]
    if not survivors:
        lines.append("None.")
    for o in survivors:
        m = o.mutant
        why = equivalent.get(m.key)
        if o.status == "equivalent":
            verdict = (
                f"equivalent (not run): {why}"
                if why
                else "**not run as equivalent, but no longer argued: run it again**"
            )
        else:
            verdict = f"equivalent: {why}" if why else "**not argued equivalent: needs a test**"
        lines += [f"- `{m.key}` (line {m.line})", f"  - {verdict}"]
    errors = [o for o in outcomes if o.status == "error"]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- `{o.mutant.key}`: {o.test}" for o in errors]
    stale = sorted(set(equivalent) - {o.mutant.key for o in outcomes}) if check_stale else []
    if stale:
        lines += ["", "## Stale equivalence notes (no such mutant this run)", ""]
        lines += [f"- `{k}`" for k in stale]
    timeouts = [o for o in outcomes if o.status == "timeout"]
    if timeouts:
        lines += ["", "## Killed by timeout", ""]
        lines += [f"- `{o.mutant.key}`" for o in timeouts]
    return "\n".join(lines) + "\n"
