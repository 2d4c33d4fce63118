"""The engine: offline ``LLM`` API, scheduler, model runner and sampler."""

from hybridkv.engine.llm import LLM
from hybridkv.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from hybridkv.engine.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestMetrics", "RequestOutput", "SamplingParams"]
