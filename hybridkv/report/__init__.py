"""``hybridkv plan``: resolve a layout, plan its KV memory, explain the plan.

- ``units.py``: memory sizes in and out (``parse_memory``, ``format_bytes``),
  compact layer-index lists;
- ``table.py``: aligned plain-text tables;
- ``resolve.py``: a YAML path, a Hugging Face model folder or a shipped name
  -> ``ModelLayout``;
- ``plan_report.py``: ``PlanOptions`` -> ``PlanReport`` (the plan, and the
  same plan under the other unification strategy);
- ``plan_table.py``: the text report; ``compare.py``: unification strategies
  side by side and the grouping choices (``--verbose``);
- ``plot.py``: the memory-layout and capacity figure (``--plot``);
- ``command.py``: the ``plan`` subcommand's arguments and entry point.

Exports are resolved on first use: ``hybridkv --help`` imports ``command.py``
(and so this package) to register ``plan``, and must not pay for pydantic
and the layouts that resolving and planning need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridkv.common.units import format_bytes
    from hybridkv.report.plan_report import PlanOptions, PlanReport, build_plan_report
    from hybridkv.report.plan_table import render_plan
    from hybridkv.report.resolve import resolve_layout
    from hybridkv.report.units import compact_indices, parse_memory

_EXPORTS = {
    "PlanOptions": "hybridkv.report.plan_report",
    "PlanReport": "hybridkv.report.plan_report",
    "build_plan_report": "hybridkv.report.plan_report",
    "render_plan": "hybridkv.report.plan_table",
    "resolve_layout": "hybridkv.report.resolve",
    "compact_indices": "hybridkv.report.units",
    "parse_memory": "hybridkv.report.units",
    "format_bytes": "hybridkv.common.units",
}

__all__ = [
    "PlanOptions",
    "PlanReport",
    "build_plan_report",
    "compact_indices",
    "format_bytes",
    "parse_memory",
    "render_plan",
    "resolve_layout",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridkv.report' has no attribute {name!r}")
