"""The product and the experiments apart: ``research/`` (one-off investigations, run by
``make test-research``) is never imported by the product (``hybridkv/``, ``kernels/``),
the maintained harnesses (``benchmarks/``), the tools, or a test of the default run
(``tests/``), and none of those puts ``research/`` on ``sys.path``.

Read with ``ast``: an ``import``/``from ... import`` of a research module's name, or a
string ``"research"`` / ``"research/..."`` outside a docstring (``ROOT / "research"``,
``sys.path.insert(0, "research")``), is a use.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESEARCH = {p.stem for p in (ROOT / "research").glob("*.py")}
CHECKED = ("hybridkv", "kernels", "benchmarks", "tools", "tests")


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the Constant nodes that are docstrings (a bare string statement)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in RESEARCH or top == "research":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {name}")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and (node.value == "research" or node.value.startswith("research/"))
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: names {node.value!r}")
    return found


def test_research_holds_the_investigations() -> None:
    # The list of one-off investigations; each a script of research/.
    assert {"bench_ceiling", "lhd_ranking", "tune_attention", "kernel_resources"} <= RESEARCH


def test_nothing_outside_research_uses_it() -> None:
    me = Path(__file__).resolve()
    uses = [
        use
        for top in CHECKED
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.resolve() != me
        for use in _uses(path)
    ]
    assert uses == [], "\n".join(uses)


def test_research_scripts_shadow_no_harness() -> None:
    # research/ scripts put benchmarks/ on sys.path too: one name must mean one module.
    harnesses = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    harnesses |= {p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir()}
    assert RESEARCH.isdisjoint(harnesses), RESEARCH & harnesses
