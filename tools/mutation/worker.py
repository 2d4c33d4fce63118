"""A worker: runs mutants in one sandbox, one at a time, each in a forked child.

Protocol (one JSON object per line): the runner writes a job
``{"file", "source" (the mutated file, latin-1), "tests", "timeout"}``; the
worker writes the mutated file into its sandbox, forks, and the child runs
``pytest -x`` on the tests in-process, cheapest files first, in a few sessions
(``files_in_order``); the worker puts the original bytes back
(in ``finally``, checked) and answers ``{"status", "test", "seconds"}`` with
status ``killed``, ``survived`` or ``timeout`` (or ``error`` with a reason).

The worker imports torch, transformers, hypothesis and pytest once, before any
fork, and never imports hybridkv: every child imports the (mutated) package
afresh, so a mutant costs its tests, not an interpreter start. Each write of a
source file gets a new modification time, so bytecode caches stay valid.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_PYTEST_ARGS = ("-x", "-q", "--no-header", "-p", "no:cacheprovider", "--hypothesis-seed=0")


#: Cheap files share one pytest session up to this much clean time: a session
#: costs its collection, so one per file would slow survivors, and one for all
#: would make every kill pay for collecting the slow files too.
GROUP_SECONDS = 2.0


def file_totals(durations: dict[str, float]) -> dict[str, float]:
    """Each test file's total clean time, from its tests' (node id) times."""
    total: dict[str, float] = {}
    for nodeid, seconds in durations.items():
        name = nodeid.split("::")[0]
        total[name] = total.get(name, 0.0) + seconds
    return total


def files_in_order(tests: list[str], durations: dict[str, float]) -> list[list[str]]:
    """``tests`` (files or node ids) grouped by file, cheapest file first (by its
    tests' total time in the clean run; files unknown to it first), then
    consecutive files merged into sessions of at most ``GROUP_SECONDS`` (a file
    slower than that alone).

    The child runs one ``pytest.main`` per session and stops at the first that
    fails: a mutant the cheap tests kill never pays for collecting the slow ones.
    """
    files: dict[str, list[str]] = {}
    for t in tests:
        files.setdefault(t.split("::")[0], []).append(t)
    total = file_totals(durations)
    sessions: list[list[str]] = []
    spent = 0.0
    for f in sorted(files, key=lambda f: (total.get(f, 0.0), f)):
        cost = total.get(f, 0.0)
        if not sessions or spent + cost > GROUP_SECONDS:
            sessions.append([])
            spent = 0.0
        sessions[-1] += files[f]
        spent += cost
    return sessions


class _Plugin:
    """pytest plugin: runs cheap tests first, records times and the first failure.

    Order: files by their total time in the clean run, then tests by their own
    time (tests unknown to the clean run first). A file stays together, so
    module-scoped fixtures are built once.
    """

    def __init__(self, durations: dict[str, float]) -> None:
        self.durations = durations
        self.seen: dict[str, float] = {}
        self.test: str | None = None

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        total = file_totals(self.durations)

        def key(item: Any) -> tuple[float, str, float]:
            name = item.nodeid.split("::")[0]
            return total.get(name, 0.0), name, self.durations.get(item.nodeid, 0.0)

        items.sort(key=key)

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.seen[report.nodeid] = self.seen.get(report.nodeid, 0.0) + report.duration
        if report.failed and self.test is None:
            self.test = report.nodeid

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed and self.test is None:
            self.test = f"collecting {report.nodeid}"


def _child(sandbox: Path, job: dict[str, Any], log: Path, result: Path) -> None:
    """In the forked child: run the tests, write the outcome, never return."""
    code = 70
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills what the tests started
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(sandbox)
        if job.get("coverage"):
            from .coverage_map import measure

            # Not -x: every test must run (and pass) to record what it executes.
            measured = measure(str(sandbox), job["tests"], _PYTEST_ARGS[1:])
            code = measured["code"]
            result.write_text(json.dumps({"code": code, "test": None, "coverage": measured}))
            return
        import pytest

        durations = job.get("durations", {})
        seen: dict[str, float] = {}
        test = None
        code = 0
        for group in files_in_order(job["tests"], durations):
            plugin = _Plugin(durations)
            code = int(pytest.main([*_PYTEST_ARGS, *group], plugins=[plugin]))
            seen |= plugin.seen
            if code != 0:
                test = plugin.test
                break
        result.write_text(json.dumps({"code": code, "test": test, "durations": seen}))
    finally:
        os._exit(code)


def _run(sandbox: Path, job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    log, result = tmp / "log.txt", tmp / "result.json"
    result.unlink(missing_ok=True)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(sandbox, job, log, result)
    deadline = start + job["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # killed before it made its group
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"status": "timeout", "test": None, "seconds": job["timeout"]}
        time.sleep(0.05)
    seconds = round(time.monotonic() - start, 2)
    if not result.exists():
        tail = log.read_text(errors="replace")[-2000:]
        return {
            "status": "killed",
            "test": f"crashed (status {status}): {tail}",
            "seconds": seconds,
        }
    out = json.loads(result.read_text())
    if out["code"] == 0:
        return {
            "status": "survived",
            "test": None,
            "seconds": seconds,
            "durations": out.get("durations", {}),
            "coverage": out.get("coverage"),
        }
    if out["code"] in (1, 2):  # tests failed / interrupted (collection error, -x)
        return {"status": "killed", "test": out["test"], "seconds": seconds}
    tail = log.read_text(errors="replace")[-2000:]
    if out["code"] == 4 and "while loading conftest" in log.read_text(errors="replace"):
        # A conftest that imports the package (tests/hardening/conftest.py) fails to
        # load: the mutant breaks the import (the clean run proved the arguments good).
        return {"status": "killed", "test": "loading a conftest", "seconds": seconds}
    return {"status": "error", "test": f"pytest exit {out['code']}: {tail}", "seconds": seconds}


_stamp = [int(time.time())]


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` with a modification time no earlier write had: a cached .pyc
    (checked by source mtime and size) can never pass for another version."""
    path.write_bytes(data)
    _stamp[0] += 1
    os.utime(path, (_stamp[0], _stamp[0]))


def serve(sandbox: Path, warm: list[str]) -> None:
    """Answer jobs from stdin until it closes (module docstring); ``warm``: modules
    to import once, before any fork."""
    for name in warm:
        importlib.import_module(name)
    assert "hybridkv" not in sys.modules, "the worker must not import hybridkv"
    with tempfile.TemporaryDirectory(prefix="mutation-worker-") as tmp:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            job = json.loads(line)
            path = sandbox / job["file"]
            original = path.read_bytes()
            try:
                _write(path, job["source"].encode("latin-1"))
                answer = _run(sandbox, job, Path(tmp))
            finally:
                _write(path, original)
            if path.read_bytes() != original:
                answer = {"status": "error", "test": f"{path} not restored", "seconds": 0}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2:])
