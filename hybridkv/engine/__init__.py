"""The engine: offline ``LLM`` API, scheduler, model runner and sampler.

Exports are resolved at first use (PEP 562) for import weight only: a
caller of one light submodule (``hybridkv.sim`` uses the scheduler, the CLI
its argument parser) does not load the model stack, transformers and the
kernels. There is no import cycle to hide: models never import the engine
(``ForwardBatch`` lives in ``hybridkv.models.batch``; see
tests/test_import_graph.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hybridkv.common.extras import require

if TYPE_CHECKING:
    from hybridkv.engine.llm import LLM
    from hybridkv.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
    from hybridkv.engine.sampling_params import SamplingParams

_EXPORTS = {
    "LLM": "hybridkv.engine.llm",
    "CompletionOutput": "hybridkv.engine.outputs",
    "RequestMetrics": "hybridkv.engine.outputs",
    "RequestOutput": "hybridkv.engine.outputs",
    "SamplingParams": "hybridkv.engine.sampling_params",
}

__all__ = ["LLM", "CompletionOutput", "RequestMetrics", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        require("torch", "engine", "hybridkv.engine")
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridkv.engine' has no attribute {name!r}")
