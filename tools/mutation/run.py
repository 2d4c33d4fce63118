"""Running mutants: sandboxes, workers, the clean baseline and the canaries.

``run`` makes one sandbox and one worker (``worker.py``) per job, then:

1. checks that each sandbox imports its own copy (``sandbox.check_imports``);
2. runs every test set once unmutated: all must pass; their times set the
   per-mutant timeouts (``TIMEOUT_FACTOR`` x the clean time + ``TIMEOUT_SLACK_S``)
   and the order of the tests (cheapest first, so most mutants die early);
3. runs one *canary* per test set, a mutant that breaks the first file mapped
   to it outright: each must be killed, or the mutated copy is not what the
   tests import and the run stops;
4. runs the mutants, each with the tests mapped to its file (``-x``).

The repository is only read. At the end every sandbox file is compared with
the repository's, and the repository's source files with their state before the
run (a changed file raises).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .coverage_map import CoverageMap
from .mutant import Mutant
from .sandbox import check_imports, make_sandbox, sandbox_env, tracked_files
from .targets import tests_for

TIMEOUT_FACTOR = 3.0
TIMEOUT_SLACK_S = 30.0
WARM_IMPORTS = ("torch", "transformers", "hypothesis", "pytest")
_TOOLS = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Outcome:
    """What one mutant did: ``killed``, ``survived``, ``timeout`` or ``error``."""

    mutant: Mutant
    status: str
    test: str | None
    seconds: float


@dataclass(frozen=True)
class Clean:
    """A test set's unmutated run: its time and each test's."""

    seconds: float
    durations: dict[str, float]


class Worker:
    """One ``worker.py`` process serving one sandbox."""

    def __init__(self, sandbox: Path, warm: tuple[str, ...] = WARM_IMPORTS) -> None:
        self.sandbox = sandbox
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mutation.worker", str(sandbox), *warm],
            cwd=_TOOLS,
            env=sandbox_env(sandbox),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"worker for {sandbox} did not start: {ready}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker for {self.sandbox} exited ({self.proc.poll()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def run(
        self,
        file: str,
        source: bytes,
        tests: tuple[str, ...],
        timeout: float,
        durations: dict[str, float],
        coverage: bool = False,
    ) -> dict[str, Any]:
        assert self.proc.stdin is not None
        job: dict[str, Any] = {"file": file, "source": source.decode("latin-1")}
        job |= {"tests": list(tests), "timeout": timeout, "durations": durations}
        job |= {"coverage": coverage}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


Job = tuple[str, bytes, tuple[str, ...], float, dict[str, float], bool]
"""file, source, tests, timeout, clean test times (to run cheap tests first),
coverage (a clean run that records what each test executes)"""


def _execute(
    workers: list[Worker],
    jobs: list[Job],
    done: Callable[[int, dict[str, Any]], None] = lambda i, r: None,
) -> list[dict[str, Any]]:
    """Run ``jobs`` on the workers (each takes the next free job); results in order."""
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(jobs)):
        todo.put(i)
    results: list[dict[str, Any]] = [{} for _ in jobs]
    errors: list[BaseException] = []

    def serve(w: Worker) -> None:
        try:
            while not errors:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = w.run(*jobs[i])
                done(i, results[i])
        except BaseException as e:  # surfaced below, after the other threads stop
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _canary(root: Path, rel: str) -> bytes:
    """``rel`` broken outright: importing it raises."""
    return b"raise RuntimeError('mutation canary')\n" + (root / rel).read_bytes()


SOURCE_DIRS = ("hybridkv/", "kernels/", "configs/")


def _source_state(root: Path) -> dict[str, bytes]:
    """The package's files (what mutants change), to check that none changed."""
    return {f: (root / f).read_bytes() for f in tracked_files(root) if f.startswith(SOURCE_DIRS)}


def run(
    root: Path,
    mutants: list[Mutant],
    jobs: int,
    progress: Callable[[str], None] = print,
    select: bool = True,
) -> tuple[list[Outcome], dict[tuple[str, ...], Clean]]:
    """Run ``mutants``; returns their outcomes and the clean time of each test set.
    ``select``: each mutant runs only the tests that execute its statement
    (``coverage_map``); False: its whole test set."""
    before = _source_state(root)
    sets = sorted({m.tests or tests_for(m.file) for m in mutants})
    with tempfile.TemporaryDirectory(prefix="hybridkv-mutation-") as tmp:
        sandboxes = [make_sandbox(root, Path(tmp) / f"s{i}") for i in range(jobs)]
        for sb in sandboxes:
            check_imports(sb)
        workers = [Worker(sb) for sb in sandboxes]
        try:
            clean = _baseline(root, workers, sets, mutants, progress)
            coverage = _coverage(root, workers, sets, mutants, progress) if select else None
            outcomes = _mutants(root, workers, mutants, clean, coverage, progress)
        finally:
            for w in workers:
                w.close()
        for sb in sandboxes:
            for f, data in before.items():
                if (sb / f).read_bytes() != data:
                    raise RuntimeError(f"sandbox {sb}: {f} was left mutated")
    if _source_state(root) != before:
        raise RuntimeError("a repository source file changed during the mutation run")
    return outcomes, clean


def _first_files(mutants: list[Mutant]) -> dict[tuple[str, ...], str]:
    """Each test set, and the first file whose mutants run it."""
    first: dict[tuple[str, ...], str] = {}
    for m in mutants:
        first.setdefault(m.tests or tests_for(m.file), m.file)
    return first


def _baseline(
    root: Path,
    workers: list[Worker],
    sets: list[tuple[str, ...]],
    mutants: list[Mutant],
    progress: Callable[[str], None],
) -> dict[tuple[str, ...], Clean]:
    first = _first_files(mutants)
    clean_jobs: list[Job] = [
        (first[s], (root / first[s]).read_bytes(), s, 3600.0, {}, False) for s in sets
    ]
    results = _execute(workers, clean_jobs)
    for s, r in zip(sets, results, strict=True):
        if r["status"] != "survived":
            raise RuntimeError(f"the unmutated code fails {s}: {r}")
        progress(f"clean: {r['seconds']:6.1f} s  {' '.join(s)}")
    clean = {
        s: Clean(float(r["seconds"]), r["durations"]) for s, r in zip(sets, results, strict=True)
    }
    canaries: list[Job] = [(first[s], _canary(root, first[s]), s, 600.0, {}, False) for s in sets]
    for s, r in zip(sets, _execute(workers, canaries), strict=True):
        if r["status"] != "killed":
            raise RuntimeError(f"a broken {first[s]} was not killed by {s}: {r}")
    progress(f"canaries: {len(sets)} broken files, all killed")
    return clean


def _coverage(
    root: Path,
    workers: list[Worker],
    sets: list[tuple[str, ...]],
    mutants: list[Mutant],
    progress: Callable[[str], None],
) -> CoverageMap:
    """Each test set once more, unmutated, under coverage with a context per test."""
    first = _first_files(mutants)
    start = time.monotonic()
    jobs: list[Job] = [
        (first[s], (root / first[s]).read_bytes(), s, 3600.0, {}, True) for s in sets
    ]
    results = _execute(workers, jobs)
    for s, r in zip(sets, results, strict=True):
        if r["status"] != "survived" or not r.get("coverage"):
            raise RuntimeError(f"the unmutated code fails {s} under coverage: {r}")
    progress(f"coverage: {len(sets)} test sets in {time.monotonic() - start:.0f} s")
    return CoverageMap.merge(r["coverage"] for r in results)


def _mutants(
    root: Path,
    workers: list[Worker],
    mutants: list[Mutant],
    clean: dict[tuple[str, ...], Clean],
    coverage: CoverageMap | None,
    progress: Callable[[str], None],
) -> list[Outcome]:
    sources = {f: (root / f).read_bytes() for f in {m.file for m in mutants}}
    jobs: list[Job] = []
    index: list[int] = []  # jobs[k] runs mutants[index[k]]
    unreached: dict[int, Outcome] = {}
    for i, m in enumerate(mutants):
        tests = m.tests or tests_for(m.file)
        durations = clean[tests].durations
        seconds = clean[tests].seconds
        if coverage is not None and not m.tests:
            source = sources[m.file]
            at, length = m.locate(source), len(m.original.encode())
            chosen = coverage.select(m.file, source, at, length, tests)
            if chosen.unreached:
                lines = f"{chosen.lines[0]}-{chosen.lines[-1]}"
                unreached[i] = Outcome(m, "survived", f"no mapped test runs lines {lines}", 0.0)
                continue
            if not chosen.whole:
                tests = chosen.tests
                seconds = sum(durations.get(t, 0.0) for t in tests)
        timeout = TIMEOUT_FACTOR * seconds + TIMEOUT_SLACK_S
        jobs.append((m.file, m.apply(sources[m.file]), tests, timeout, durations, False))
        index.append(i)
    if unreached:
        progress(f"{len(unreached)} mutants on lines no mapped test runs: survivors, not run")
    start = time.monotonic()
    lock = threading.Lock()
    count = [0]

    def done(i: int, r: dict[str, Any]) -> None:
        with lock:
            count[0] += 1
            elapsed = time.monotonic() - start
            progress(
                f"[{count[0]:4d}/{len(jobs)} {elapsed:6.0f} s] {r['status']:8s} "
                f"{r['seconds']:5.1f} s  {mutants[index[i]].key}"
            )

    results = _execute(workers, jobs, done)
    ran = {
        index[k]: Outcome(mutants[index[k]], r["status"], r.get("test"), float(r["seconds"]))
        for k, r in enumerate(results)
    }
    return [ran[i] if i in ran else unreached[i] for i in range(len(mutants))]
