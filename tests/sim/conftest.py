"""Fixtures of the trace-replay tests: trace files and small layouts in ``tmp_path``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

# One full-attention layer, 1 KV head of 8, float16: a 16-token block is
# 2 * 16 * 1 * 8 * 2 = 512 bytes, and there is a single group.
ONE_FULL_YAML = """\
name: one-full
cache_dtype: float16
max_model_len: 4096
layer_kinds:
  full: {kind: full, num_kv_heads: 1, head_dim: 8}
layers: [full]
"""

TraceWriter = Callable[..., Path]


@pytest.fixture
def write_trace(tmp_path: Path) -> TraceWriter:
    """``write_trace(rows, name=...)``: a trace file; dict rows as JSON, str rows verbatim."""

    def write(rows: list[dict | str], name: str = "trace.jsonl") -> Path:
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write


@pytest.fixture
def one_full(tmp_path: Path) -> Path:
    """The path of the one-full-attention-layer layout (``ONE_FULL_YAML``)."""
    path = tmp_path / "one-full.yaml"
    path.write_text(ONE_FULL_YAML, encoding="utf-8")
    return path
