"""The engine: offline ``LLM`` API, scheduler, model runner and sampler.

Exports are resolved lazily so that the models (which import
``hybridkv.engine.forward_batch``) and the engine (which imports the models)
can be imported in either order.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hybridkv.extras import require

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
