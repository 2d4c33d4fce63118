"""Which tests execute which lines: each mutant runs only the tests that reach it.

Measured once per run, on the unmutated copy: every test set runs under
coverage.py with one *context* per test (its node id), so each executed line of
a target file knows the tests that executed it.

Contexts (``ContextPlugin``):

- a test's setup, call and teardown: the test's node id;
- a fixture wider than a function (module, class, package, session): ``@`` and
  the fixture's ``baseid``. Its value feeds every test below that node, so a
  line it runs selects all of them;
- anything else (imports at collection, module bodies, ``def`` lines and their
  defaults): the empty context. Such a line selects the whole test set.

Selection (``CoverageMap.select``) for a mutant at byte offset ``at``:

1. the statement around it: the innermost statement whose lines hold the
   mutant's lines; for a compound statement (``if``, ``for``, ``def`` ...) only
   its header lines (a mutant in an ``if`` condition selects the tests that
   evaluate it, not those that only run its body). A mutant outside any such
   span (a decorator, an ``else:``) selects the whole set;
2. the union of the contexts of those lines; the empty context selects the
   whole set;
3. no context at all: no mapped test executes the statement, so the mutant
   cannot be killed by them (reported as a survivor without running).

Why it is sound: with the code before a line unchanged, a test that never
reaches the line behaves identically on the mutant. Two ways around that,
neither used by the mapped tests today: a test whose only run of the code is in
a subprocess (``test_hashing``'s subprocess compares with an in-process run of
the same code), and a memo filled by one test and read by a later one. The
report names the run's selection, and ``--no-select`` runs every mutant on its
whole set for a check.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

WIDE = "@"  # context prefix of a fixture wider than one test


class ContextPlugin:
    """pytest plugin: switches the coverage context per test and per wide fixture,
    and records the collected node ids."""

    def __init__(self, cov: Any) -> None:
        self.cov = cov
        self.nodeids: list[str] = []
        self.current = ""

    def _switch(self, context: str) -> None:
        self.current = context
        self.cov.switch_context(context)

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        self.nodeids = [item.nodeid for item in items]

    def _wrap(self, context: str) -> Any:
        before = self.current
        self._switch(context)
        try:
            yield
        finally:
            self._switch(before)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        yield from self._wrap(item.nodeid)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Any:
        if fixturedef.scope == "function":
            yield
        else:
            yield from self._wrap(WIDE + fixturedef.baseid)


def measure(sandbox: str, tests: list[str], pytest_args: Iterable[str]) -> dict[str, Any]:
    """In a fresh child that has not imported hybridkv: run ``tests`` under coverage
    of ``sandbox/hybridkv``; returns ``{"code", "nodeids", "lines"}`` with
    ``lines[file][line] = [contexts]`` (files relative to the sandbox)."""
    import os

    import coverage

    real = os.path.realpath(sandbox)
    cov = coverage.Coverage(data_file=None, include=[os.path.join(real, "hybridkv", "*")])
    plugin = ContextPlugin(cov)
    cov.start()
    try:
        code = int(pytest.main([*pytest_args, *tests], plugins=[plugin]))
    finally:
        cov.stop()
    data = cov.get_data()
    lines: dict[str, dict[str, list[str]]] = {}
    for path in data.measured_files():
        rel = os.path.relpath(os.path.realpath(path), real)
        by_line = data.contexts_by_lineno(path)
        lines[rel] = {str(n): sorted(c) for n, c in by_line.items() if c}
    return {"code": code, "nodeids": plugin.nodeids, "lines": lines}


@dataclass(frozen=True)
class Selection:
    """The tests a mutant runs: node ids, or the whole set (``whole``), or none."""

    tests: tuple[str, ...]
    whole: bool
    lines: tuple[int, ...]

    @property
    def unreached(self) -> bool:
        return not self.whole and not self.tests


class CoverageMap:
    """Per-line contexts of the target files, and the node ids of each test set."""

    def __init__(
        self, lines: Mapping[str, Mapping[int, Iterable[str]]], nodeids: Iterable[str]
    ) -> None:
        self.lines = {f: {n: frozenset(c) for n, c in by.items()} for f, by in lines.items()}
        self.nodeids = tuple(dict.fromkeys(nodeids))
        self._spans: dict[tuple[str, bytes], list[tuple[int, int, int]]] = {}

    @classmethod
    def merge(cls, measured: Iterable[Mapping[str, Any]]) -> CoverageMap:
        """One map from several ``measure`` results."""
        lines: dict[str, dict[int, set[str]]] = {}
        nodeids: list[str] = []
        for m in measured:
            nodeids += m["nodeids"]
            for f, by in m["lines"].items():
                for n, c in by.items():
                    lines.setdefault(f, {}).setdefault(int(n), set()).update(c)
        return cls(lines, nodeids)

    def select(
        self, file: str, source: bytes, at: int, length: int, mapped: tuple[str, ...]
    ) -> Selection:
        """The tests for a mutant of ``length`` bytes at byte ``at`` of ``file``
        (module docstring), among the test files ``mapped`` to ``file``: the
        map also holds what other files' test sets run, which this mutant's
        run must not take in."""
        first = source[:at].count(b"\n") + 1
        last = first + source[at : at + length].count(b"\n")
        span = self._statement(file, source, first, last)
        if span is None:
            return Selection((), True, ())
        lines = tuple(range(span[0], span[1] + 1))
        by_line = self.lines.get(file, {})
        contexts: set[str] = set()
        for n in lines:
            contexts |= by_line.get(n, frozenset())
        if "" in contexts:
            return Selection((), True, lines)
        chosen: dict[str, None] = {}
        for c in sorted(contexts):
            if c.startswith(WIDE):
                base = c[len(WIDE) :]
                chosen.update((n, None) for n in self.nodeids if n.startswith(base))
            else:
                chosen[c] = None
        allowed = set(mapped)
        tests = tuple(n for n in chosen if n.split("::")[0] in allowed)
        return Selection(tests, False, lines)

    def _statement(self, file: str, source: bytes, first: int, last: int) -> tuple[int, int] | None:
        """First and last line of the innermost statement (a compound one's header)
        holding lines ``first..last``; None when a mutant lies outside them."""
        key = (file, source)
        if key not in self._spans:
            self._spans[key] = _statement_spans(source)
        best: tuple[int, int, int] | None = None
        for lo, hi, depth in self._spans[key]:
            if lo <= first and last <= hi and (best is None or depth > best[2]):
                best = (lo, hi, depth)
        if best is None:
            return None
        return best[0], best[1]


def _statement_spans(source: bytes) -> list[tuple[int, int, int]]:
    """(first line, last line, depth) of every statement: a simple statement whole,
    a compound statement's header up to the line before its first child."""
    out: list[tuple[int, int, int]] = []

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                end = child.end_lineno or child.lineno
                bodies = [
                    b
                    for name in ("body", "orelse", "finalbody", "handlers", "cases")
                    for b in getattr(child, name, None) or []
                    if isinstance(b, ast.AST) and hasattr(b, "lineno")
                ]
                if bodies:
                    end = min(b.lineno for b in bodies) - 1
                out.append((child.lineno, max(end, child.lineno), depth))
            visit(child, depth + 1)

    visit(ast.parse(source), 0)
    return out
