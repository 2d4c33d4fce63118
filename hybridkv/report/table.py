"""Aligned plain-text tables: the one layout every section of the report uses."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    indent: str = "  ",
    left: Sequence[str] = (),
) -> list[str]:
    """Lines of a table; numbers (and their ``%``/``x`` forms) right-aligned.

    A column is right-aligned when every cell of it looks numeric, so ``"3.96%"``
    lines up under ``"12.00%"``, unless its header is in ``left`` (for lists
    such as ``"0,7,14"``); text columns are left-aligned. Trailing blanks are
    stripped.
    """
    cells = [[str(c) for c in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells for {len(headers)} headers")
    widths = [max([len(h), *(len(r[k]) for r in cells)]) for k, h in enumerate(headers)]
    right = [
        h not in left and bool(cells) and all(_numeric(r[k]) for r in cells)
        for k, h in enumerate(headers)
    ]

    def line(values: Sequence[str]) -> str:
        out = [
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        ]
        return (indent + "  ".join(out)).rstrip()

    return [line(list(headers)), *(line(r) for r in cells)]


def _numeric(cell: str) -> bool:
    core = cell.replace(",", "").rstrip("%x").lstrip("+")
    try:
        float(core)
    except ValueError:
        return cell in ("-", "")
    return True
