"""Generated mutants: a few AST operators that model realistic slips.

Operators (each gives one mutant per site):

- ``compare``: flip one comparison at its boundary or its sense
  (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``);
- ``boolop``: ``and`` <-> ``or``; ``drop``: leave out one operand of an ``and`` / ``or``;
- ``not``: drop a ``not``; ``negate``: negate an ``if`` (or conditional expression)
  whose test is not already a flippable comparison (that is ``compare``);
- ``const``: an integer in a comparison, arithmetic or slice off by one (+1, and -1
  when positive);
- ``arith``: ``+`` <-> ``-`` (not where an operand is surely a string, bytes or a
  list); ``minmax``: ``min`` <-> ``max``; ``bool``: ``True`` <-> ``False``;
- ``stmt``: drop a call statement or an augmented assignment (``pass`` instead).

Not mutated: ``assert`` and ``raise`` statements and ``zip(..., strict=True)``
(internal checks and error messages), ``check_integrity`` and ``__repr__``
bodies, annotations, docstrings, f-strings, decorators and ``if TYPE_CHECKING:``
blocks. A mutant's key is its file,
enclosing function and the text change (``#2``... when one function has the same
change twice), so keys survive edits elsewhere in the file.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from .mutant import Mutant

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_SKIP_FUNCTIONS = frozenset({"check_integrity", "__repr__", "__str__"})


def _text(node: ast.AST) -> str:
    """Source of a replacement node, parenthesised unless it is atomic."""
    out = ast.unparse(node)
    atomic = isinstance(node, ast.Name | ast.Constant | ast.Attribute | ast.Call)
    return out if atomic else f"({out})"


class _Sites(ast.NodeVisitor):
    """Collects ``(node, replacement text, operator)`` for one module."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[ast.expr | ast.stmt, str, str, str]] = []  # node, new, op, scope

    def _add(self, node: ast.expr | ast.stmt, new: str, op: str) -> None:
        self.found.append((node, new, op, ".".join(self.scope) or "<module>"))

    # -- scopes and skipped regions -------------------------------------------------
    def _visit_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        if node.name in _SKIP_FUNCTIONS:
            return
        self.scope.append(node.name)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for stmt in body:
            self.visit(stmt)
        if not isinstance(node, ast.ClassDef):
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    self.visit(default)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_def

    def visit_Assert(self, node: ast.Assert) -> None:
        pass

    def visit_Raise(self, node: ast.Raise) -> None:
        pass

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        pass

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            return
        if not _is_flippable(test) and not isinstance(test, ast.UnaryOp | ast.BoolOp):
            self._add(test, _text(ast.UnaryOp(ast.Not(), test)), "negate")
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        if not _is_flippable(node.test) and not isinstance(node.test, ast.UnaryOp):
            self._add(node.test, _text(ast.UnaryOp(ast.Not(), node.test)), "negate")
        self.generic_visit(node)

    # -- operators --------------------------------------------------------------------
    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            flipped = _FLIP.get(type(op))
            if flipped is not None:
                ops = [*node.ops[:i], flipped(), *node.ops[i + 1 :]]
                self._add(node, _text(ast.Compare(node.left, ops, node.comparators)), "compare")
        self._constants(node.left, *node.comparators)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        other: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._add(node, _text(ast.BoolOp(other, node.values)), "boolop")
        for i in range(len(node.values)):
            rest = node.values[:i] + node.values[i + 1 :]
            new = rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
            self._add(node, _text(new), "drop")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self._add(node, _text(node.operand), "not")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        swap = {ast.Add: ast.Sub, ast.Sub: ast.Add}.get(type(node.op))
        if swap is not None and _numeric(node.left) and _numeric(node.right):
            self._add(node, _text(ast.BinOp(node.left, swap(), node.right)), "arith")
        self._constants(node.left, node.right)
        self.generic_visit(node)

    def visit_Slice(self, node: ast.Slice) -> None:
        self._constants(node.lower, node.upper)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            other = "max" if node.func.id == "min" else "min"
            self._add(node.func, other, "minmax")
        self.visit(node.func)
        for arg in node.args:
            self.visit(arg)
        for kw in node.keywords:
            if kw.arg != "strict":  # zip(..., strict=True) is a check, like an assert
                self.visit(kw.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, bool):
            self._add(node, str(not node.value), "bool")

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call):
            self._add(node, "pass", "stmt")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._add(node, "pass", "stmt")
        self.generic_visit(node)

    def _constants(self, *nodes: ast.expr | None) -> None:
        for node in nodes:
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, int)
                and not isinstance(node.value, bool)
            ):
                self._add(node, str(node.value + 1), "const")
                if node.value > 0:
                    self._add(node, str(node.value - 1), "const")


_NUMERIC_CALLS = frozenset({"len", "min", "max", "sum", "cdiv", "int"})


def _numeric(node: ast.expr) -> bool:
    """False for operands that are surely not numbers (``+`` joins them): string
    and byte literals, f-strings, lists, and calls other than a few numeric ones."""
    if isinstance(node, ast.Constant):
        return not isinstance(node.value, str | bytes)
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _NUMERIC_CALLS
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    return not isinstance(node, ast.JoinedStr | ast.List | ast.ListComp | ast.Tuple)


def _is_flippable(test: ast.expr) -> bool:
    return isinstance(test, ast.Compare) and all(type(op) in _FLIP for op in test.ops)


def _line_starts(source: bytes) -> list[int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def generate_file(root: Path, rel: str) -> Iterator[Mutant]:
    """Every generated mutant of ``root / rel``, in source order."""
    source = (root / rel).read_bytes()
    tree = ast.parse(source, filename=rel)
    sites = _Sites()
    sites.visit(tree)
    starts = _line_starts(source)
    seen: Counter[str] = Counter()
    rows = []
    for node, new, op, qualname in sites.found:
        assert node.end_lineno is not None and node.end_col_offset is not None
        start = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        rows.append((start, end, node.lineno, new, op, qualname))
    for start, end, line, new, op, qualname in sorted(rows, key=lambda r: (r[0], -r[1])):
        original = source[start:end].decode()
        key = f"{rel}::{qualname}::{op}: {' '.join(original.split())} -> {new}"
        seen[key] += 1
        if seen[key] > 1:
            key += f" #{seen[key]}"
        yield Mutant(rel, original, new, op, key, line=line, start=start)
