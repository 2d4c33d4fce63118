"""``python -m mutation`` (run from ``tools/``; ``make mutation``): see ``__init__``."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from .curated import CURATED
from .equivalent import EQUIVALENT
from .generate import generate_file
from .mutant import Mutant
from .report import commit_of, render, summarize
from .results import load, save
from .run import Outcome, run
from .targets import target_files

ROOT = Path(__file__).resolve().parents[2]
TARGET_RATE = 0.95


def all_mutants(root: Path) -> list[Mutant]:
    """Curated then generated mutants, without duplicates (same file, same result)."""
    sources = {}
    seen = set()
    out = []
    generated = [m for f in target_files(root) for m in generate_file(root, f)]
    for m in [*CURATED, *generated]:
        if m.file not in sources:
            sources[m.file] = (root / m.file).read_bytes()
        source = sources[m.file]
        result = (m.file, m.apply(source))
        if result not in seen:
            seen.add(result)
            line = source[: m.locate(source)].count(b"\n") + 1
            out.append(replace(m, line=line))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2, help="workers (sandboxes), default 2")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run mutants whose key contains this text (repeat: any of them)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--recheck-equivalent",
        action="store_true",
        help="also run the mutants argued equivalent (equivalent.yaml); by default they are "
        "reported with their argument but not run (each would run all its tests)",
    )
    parser.add_argument(
        "--no-select",
        action="store_true",
        help="run each mutant on its file's whole test set, not only the tests that execute "
        "its statement (a check of the coverage-based selection; slower)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/mutation.md"))
    parser.add_argument(
        "--report-from",
        metavar="JSON",
        help="re-render the report from a run's saved outcomes (after adding equivalence notes)",
    )
    parser.add_argument(
        "--update",
        metavar="JSON",
        help="re-run only the --only mutants (after adding tests) and take every other "
        "outcome from this saved full run; the report names both commits",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    saved = out.with_suffix(".json")
    if args.update:
        if not args.only:
            parser.error("--update needs --only: the mutants to re-run")
        return _update(Path(args.update), args.only, args.jobs, not args.no_select, out)
    if args.report_from:
        outcomes, clean, seconds, jobs, only, commit, select = load(Path(args.report_from))
    else:
        mutants = [
            m for m in all_mutants(ROOT) if not args.only or any(t in m.key for t in args.only)
        ]
        if args.list:
            for m in mutants:
                print(f"{m.file}:{m.line}: {m.key}")
            print(f"{len(mutants)} mutants")
            return 0
        start, commit = time.monotonic(), commit_of(ROOT)
        skip = set() if args.recheck_equivalent else {m.key for m in mutants} & set(EQUIVALENT)
        todo = [m for m in mutants if m.key not in skip]
        ran, clean = run(ROOT, todo, args.jobs, select=not args.no_select)
        by_key = {o.mutant.key: o for o in ran}
        outcomes = [
            by_key[m.key] if m.key not in skip else Outcome(m, "equivalent", None, 0.0)
            for m in mutants
        ]
        seconds, jobs, only = time.monotonic() - start, args.jobs, " | ".join(args.only)
        select = not args.no_select
        save(saved, outcomes, clean, seconds, jobs, only, commit, select)
    report = render(ROOT, outcomes, clean, EQUIVALENT, seconds, jobs, commit, select, not only)
    out.write_text(report)
    s = summarize(outcomes, EQUIVALENT)
    print(
        f"kill rate {100 * s.rate:.1f}% ({s.killed}/{s.total}, {s.equivalent} equivalent, "
        f"{s.survivors} survivors, {s.errors} errors) in {seconds / 60:.1f} min; "
        f"report: {out}"
    )
    return 0 if s.rate >= TARGET_RATE and not s.errors else 1


def _update(full_run: Path, only: list[str], jobs: int, select: bool, out: Path) -> int:
    """``--update``: re-run the mutants matching ``only``; the rest from ``full_run``."""
    outcomes, clean, seconds, _, old_only, old_commit, old_select = load(full_run)
    if old_only or old_select != select:
        raise SystemExit(f"{full_run} is not a full run with the same selection")
    before = {o.mutant.key: o for o in outcomes}
    mutants = all_mutants(ROOT)
    again = [m for m in mutants if any(t in m.key for t in only)]
    missing = [m.key for m in mutants if m not in again and m.key not in before]
    if missing:
        raise SystemExit(f"not in {full_run}, add them to --only: {missing[:5]} ...")
    start, commit = time.monotonic(), commit_of(ROOT)
    todo = [m for m in again if m.key not in EQUIVALENT]
    ran, clean_again = run(ROOT, todo, jobs, select=select)
    by_key = {o.mutant.key: o for o in ran}
    merged = []
    for m in mutants:
        if m.key in EQUIVALENT:
            merged.append(Outcome(m, "equivalent", None, 0.0))
        elif m.key in by_key:
            merged.append(by_key[m.key])
        else:
            o = before[m.key]
            merged.append(Outcome(m, o.status, o.test, o.seconds))
    took = time.monotonic() - start
    note = f"{old_commit}; {len(todo)} mutants re-run at {commit} in {took / 60:.1f} min"
    both = clean | clean_again
    save(out.with_suffix(".json"), merged, both, seconds, jobs, "", note, select)
    out.write_text(render(ROOT, merged, both, EQUIVALENT, seconds, jobs, note, select))
    s = summarize(merged, EQUIVALENT)
    print(
        f"kill rate {100 * s.rate:.1f}% ({s.killed}/{s.total}, {s.equivalent} equivalent, "
        f"{s.survivors} survivors, {s.errors} errors); report: {out}"
    )
    return 0 if s.rate >= TARGET_RATE and not s.errors else 1


if __name__ == "__main__":
    sys.exit(main())
