"""The mutation runner (tools/mutation, ``make mutation``): its mutant list cannot rot
silently, and a worker kills, spares and restores on a tiny sandbox."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from mutation.__main__ import all_mutants  # noqa: E402
from mutation.curated import CURATED  # noqa: E402
from mutation.equivalent import EQUIVALENT  # noqa: E402
from mutation.generate import generate_file  # noqa: E402
from mutation.mutant import Mutant, MutationError  # noqa: E402
from mutation.run import Worker  # noqa: E402
from mutation.targets import target_files  # noqa: E402
from mutation.targets import tests_for as mapped_tests  # noqa: E402
from mutation.worker import files_in_order  # noqa: E402


@pytest.mark.parametrize("m", CURATED, ids=lambda m: m.description)
def test_curated_snippets_occur_exactly_once(m: Mutant) -> None:
    source = (ROOT / m.file).read_bytes()
    assert source.count(m.original.encode()) == 1, f"{m.key}: edit the entry"
    mutated = m.apply(source)
    assert mutated != source
    ast.parse(mutated)


def test_every_generated_mutant_applies_and_parses() -> None:
    mutants = all_mutants(ROOT)
    keys = [m.key for m in mutants]
    assert len(keys) == len(set(keys)), "two mutants share a key"
    for f in target_files(ROOT):
        assert (ROOT / f).is_file() and all((ROOT / t).is_file() for t in mapped_tests(f))
        source = (ROOT / f).read_bytes()
        for m in generate_file(ROOT, f):
            mutated = m.apply(source)
            assert mutated != source, m.key
            ast.parse(mutated)
    assert {m.file for m in CURATED} <= set(target_files(ROOT))


def test_equivalence_notes_name_real_mutants() -> None:
    keys = {m.key for m in all_mutants(ROOT)}
    assert set(EQUIVALENT) <= keys, sorted(set(EQUIVALENT) - keys)
    assert all(len(why) > 40 for why in EQUIVALENT.values()), "argue each one"


def test_a_mutant_that_moved_is_an_error() -> None:
    m = Mutant("x.py", "a < b", "a <= b", "compare", "k")
    assert m.apply(b"if a < b:\n") == b"if a <= b:\n"
    with pytest.raises(MutationError, match="occurs 2 times"):
        m.apply(b"a < b\na < b\n")
    with pytest.raises(MutationError, match="not at byte"):
        Mutant("x.py", "a < b", "a <= b", "compare", "k", start=0).apply(b"if a < b:\n")


def test_worker_kills_spares_and_restores(tmp_path: Path) -> None:
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    original = (tmp_path / "calc.py").read_bytes()
    w = Worker(tmp_path, warm=("pytest",))
    try:
        tests = ("test_calc.py",)

        def run(source: bytes, timeout: float = 60.0) -> dict[str, object]:
            return w.run("calc.py", source, tests, timeout, {})

        assert run(original)["status"] == "survived"
        killed = run(original.replace(b"a + b", b"a - b"))
        assert killed["status"] == "killed" and killed["test"] == "test_calc.py::test_add"
        assert run(original.replace(b"a + b", b"b + a"))["status"] == "survived"
        hang = b"import time\ntime.sleep(60)\n" + original
        assert run(hang, timeout=1.5)["status"] == "timeout"
    finally:
        w.close()
    assert (tmp_path / "calc.py").read_bytes() == original


_CALC = """SCALE = 2


def add(a, b):
    return a + b


def sub(a, b):
    if a > b:
        return a - b
    return -(b - a)


def unused(a):
    return a * SCALE


def table():
    return [add(1, 1)]
"""

_TESTS = """import pytest
from hybridkv.calc import add, sub, table


@pytest.fixture(scope="module")
def shared():
    return table()


def test_add():
    assert add(2, 3) == 5


def test_sub():
    assert sub(1, 3) == -2


def test_shared(shared):
    assert shared == [2]


def test_other(shared):
    assert True
"""


def test_selection_runs_only_the_tests_that_reach_a_mutant(tmp_path: Path) -> None:
    """Per-test coverage on a tiny package: a line one test runs selects that test;
    a line run at import selects the whole set; a line only a module-scoped fixture
    runs selects every test of that module; a line no test runs selects none."""
    from mutation.coverage_map import CoverageMap

    (tmp_path / "hybridkv").mkdir()
    (tmp_path / "hybridkv" / "__init__.py").write_text("")
    (tmp_path / "hybridkv" / "calc.py").write_text(_CALC)
    (tmp_path / "test_calc.py").write_text(_TESTS)
    source = _CALC.encode()
    w = Worker(tmp_path, warm=("pytest",))
    try:
        r = w.run("hybridkv/calc.py", source, ("test_calc.py",), 120.0, {}, coverage=True)
    finally:
        w.close()
    assert r["status"] == "survived", r
    cov = CoverageMap.merge([r["coverage"]])

    def chosen(text: str) -> tuple[str, ...] | str:
        at = source.index(text.encode())
        s = cov.select("hybridkv/calc.py", source, at, len(text), ("test_calc.py",))
        return "whole" if s.whole else s.tests

    # add() runs in test_add and in the module-scoped fixture: every test of the module.
    assert set(chosen("a + b")) == {
        "test_calc.py::test_add",
        "test_calc.py::test_sub",
        "test_calc.py::test_shared",
        "test_calc.py::test_other",
    }
    assert chosen("a > b") == ("test_calc.py::test_sub",)
    assert chosen("-(b - a)") == ("test_calc.py::test_sub",)
    assert chosen("return a - b") == ()  # test_sub takes the other branch
    assert chosen("a * SCALE") == ()  # nobody calls unused()
    assert chosen("SCALE = 2") == "whole"  # run at import
    assert chosen("def sub(a, b)") == "whole"
    # Only the mutant's mapped test files: another set's tests never join its run.
    at = source.index(b"a > b")
    assert cov.select("hybridkv/calc.py", source, at, 5, ("other_test.py",)).tests == ()


def test_files_run_cheapest_first_in_sessions_of_cheap_files() -> None:
    durations = {"a.py::t1": 3.0, "a.py::t2": 1.0, "b.py::t": 1.5, "c.py::t": 0.4}
    durations["d.py::t"] = 0.5
    tests = ["a.py::t1", "b.py", "new.py", "a.py::t2", "c.py::t", "d.py"]
    # new (0) + c (0.4) + d (0.5) fit in 2 s; b (1.5) would not: its own session;
    # a (4.0) is slower than a session: alone.
    assert files_in_order(tests, durations) == [
        ["new.py", "c.py::t", "d.py"],
        ["b.py"],
        ["a.py::t1", "a.py::t2"],
    ]
