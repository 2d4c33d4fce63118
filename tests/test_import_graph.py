"""No import cycle among the modules of ``hybridkv/`` and ``kernels/``.

The graph: one node per module (``kernels/x.py`` is ``hybridkv.kernels.x``, a
package is its ``__init__``); an edge for every ``import`` / ``from ... import``
statement of a module, read with ``ast``, wherever it sits: module level,
inside functions and methods, in ``try`` blocks, and under ``if
TYPE_CHECKING:`` (a cycle that only the type checker follows is still two
modules that each need the other). What does not count:

- imports by string (``importlib.import_module``: the PEP 562 exports of
  ``hybridkv/engine/__init__.py``, the backend registry's ``"module:Class"``
  and ``Implementations``' ``"module:attr"`` entries): ast cannot see them;
- the parent packages Python runs before a module (importing
  ``hybridkv.kernels.cpu.ops`` runs ``hybridkv/kernels/__init__.py``): only
  the imports a module writes are edges.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else
to ``pkg``. Modules outside the two trees are ignored.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = {"hybridkv": ROOT / "hybridkv", "hybridkv.kernels": ROOT / "kernels"}

#: Known cycles, each to be removed by the change that breaks it. Do not add to this.
#: (Empty: the last one, hashing <-> request, went when BlockHasher took plain data.)
ALLOWED_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for prefix, tree in TREES.items():
        for path in sorted(tree.rglob("*.py")):
            parts = list(path.relative_to(tree).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([prefix, *parts])
            if prefix == "hybridkv" and name.startswith("hybridkv.kernels"):
                continue  # no such folder under hybridkv/; kernels/ is the package
            found[name] = path
    return found


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """``(imported module, names)`` of every import statement in ``tree``."""
    out: list[tuple[str, list[str]]] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            out.append((base, [alias.name for alias in node.names]))
        stack.extend(ast.iter_child_nodes(node))
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the two trees it imports (see the module docstring)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, names in _imports(tree, name, path.name == "__init__.py"):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            for dest in subs or ([target] if target in modules else []):
                if dest != name:
                    graph[name].add(dest)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_modules_and_their_imports() -> None:
    graph = import_graph()
    assert "hybridkv.kernels.cpu.ops" in graph  # kernels/ maps onto hybridkv.kernels
    assert "hybridkv.kernels.cpu.ffi" in graph["hybridkv.kernels.cpu.ops"]
    assert "hybridkv.models.batch" in graph["hybridkv.engine.runner"]
    # Function-level imports count (backend.py imports the C package when asked for it),
    # and so do TYPE_CHECKING ones (rotary.py names ForwardBatch only in annotations).
    assert "hybridkv.kernels.cpu" in graph["hybridkv.kernels.backend"]
    assert "hybridkv.models.batch" in graph["hybridkv.models.layers.rotary"]


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = [frozenset(c) for c in cycles(import_graph())]
    assert [sorted(c) for c in found if c not in ALLOWED_CYCLES] == []
    # An allowed cycle that is gone must leave the list (so the list only shrinks).
    assert [sorted(c) for c in ALLOWED_CYCLES if c not in found] == []


def test_models_never_import_the_engine() -> None:
    graph = import_graph()
    upward = sorted(
        (m, d)
        for m, deps in graph.items()
        if m.startswith(("hybridkv.models", "hybridkv.kernels"))
        for d in deps
        if d.startswith(("hybridkv.engine", "hybridkv.serving"))
    )
    assert upward == []


#: The layers of the KV cache manager, lowest first: a module imports only
#: from its own layer or below (``docs/architecture.md``). ``hybridkv.common`` holds
#: the leaf helpers every layer may use; the tiers under an engine's pool (offload)
#: sit on the manager API, the engine, the simulator and the server on both, and
#: nothing below imports them.
LAYERS = (
    ("hybridkv.common",),
    ("hybridkv.specs",),
    ("hybridkv.core",),
    ("hybridkv.managers",),
    ("hybridkv.policy",),
    ("hybridkv.coordinators",),
    ("hybridkv.cache_manager",),
    ("hybridkv.offload",),
    ("hybridkv.engine", "hybridkv.sim", "hybridkv.serving"),
)
#: The online learners and the rules they steer: only ``hybridkv.policy`` imports them.
LEARNERS = {
    f"hybridkv.policy.{m}"
    for m in (
        "retention",
        "tail_alignment",
        "fine_alignment",
        "returning",
        "cost_aware",
        "release",
        "shedding",
    )
}


def _layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_the_cache_layers_import_downwards_only() -> None:
    graph = import_graph()
    up = [
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if (lm := _layer(m)) is not None and (ld := _layer(d)) is not None and ld > lm
    ]
    assert up == [], f"imports that run up the layers: {up}"


def test_only_the_policy_package_imports_a_learner() -> None:
    graph = import_graph()
    assert set(graph) >= LEARNERS, "a learner moved: update LEARNERS"
    outside = sorted(
        (m, d)
        for m, deps in graph.items()
        if not m.startswith("hybridkv.policy")
        for d in deps & LEARNERS
    )
    assert outside == [], f"learners imported outside hybridkv.policy: {outside}"


def test_common_imports_nothing_else_of_hybridkv() -> None:
    graph = import_graph()
    common = {m for m in graph if m.startswith("hybridkv.common")}
    assert common, "hybridkv.common moved: update the test"
    outside = sorted(
        (m, d) for m in common for d in graph[m] if not d.startswith("hybridkv.common")
    )
    assert outside == [], f"hybridkv.common must stay a leaf: {outside}"


def test_no_loose_modules_at_the_top_of_hybridkv() -> None:
    """Every module of ``hybridkv/`` lives in a package that says what it is, except the
    package itself and its entry points (issue 43, part 8)."""
    top = {p.stem for p in (ROOT / "hybridkv").glob("*.py")}
    assert top <= {"__init__", "__main__", "cli", "walkthrough"}, sorted(top)
