"""Run vLLM's own grouping heuristic on our specs, to check ``grouping="vllm"``.

vLLM is not installed: the two functions ``_get_kv_cache_groups_uniform_page_size``
and ``create_kv_cache_group_specs`` are read out of vLLM's source file
(``vllm/v1/core/kv_cache_planning.py`` of the unpacked release the shared
baseline harness downloads) with ``ast`` and executed here, with minimal
stand-ins for vLLM's spec classes: a spec's ``merge`` succeeds only for equal
specs (vLLM merges different attention types never, and same-type specs only
when their block layout matches, which for our specs means equal).
Nothing of vLLM is copied into this repository.
"""

from __future__ import annotations

import ast
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FUNCTIONS = ("_get_kv_cache_groups_uniform_page_size", "create_kv_cache_group_specs")


@dataclass(frozen=True)
class _Group:
    layer_names: list[str]
    kv_cache_spec: Any


class _Spec:
    """Wraps one of our specs; ``merge`` fails unless all specs are equal."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Spec) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)

    @classmethod
    def merge(cls, specs: list[_Spec]) -> _Spec:
        if any(s != specs[0] for s in specs):
            raise ValueError("specs differ")
        return specs[0]


def load_vllm_grouping(vllm_src: Path) -> Any:
    """vLLM's grouping function, executed from its source file."""
    path = vllm_src / "vllm" / "v1" / "core" / "kv_cache_planning.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in FUNCTIONS]
    if len(keep) != len(FUNCTIONS):
        raise RuntimeError(f"{path}: did not find {FUNCTIONS}")
    module = ast.Module(body=keep, type_ignores=[])
    ns: dict[str, Any] = {
        "defaultdict": defaultdict,
        "cdiv": lambda a, b: -(-a // b),
        "logger": logging.getLogger("vllm-grouping"),
        "KVCacheSpec": Any,
        "KVCacheGroupSpec": _Group,
        "UniformTypeKVCacheSpecs": type("UniformTypeKVCacheSpecs", (), {}),
    }
    exec(compile(module, str(path), "exec"), ns)
    return ns["_get_kv_cache_groups_uniform_page_size"]


def vllm_groups(fn: Any, unified_specs: dict[str, Any]) -> list[list[str]]:
    """Layer names of each group vLLM's heuristic makes from unified specs."""
    groups = fn({name: _Spec(s) for name, s in unified_specs.items()})
    return [list(g.layer_names) for g in groups]
