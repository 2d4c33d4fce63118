"""CUDA graphs of the engine's steps (``LLM(cuda_graphs=True)``).

- ``shapes``: which steps are graphed (decode steps; small steps of any mix) and
  the padded shape each is captured at;
- ``static_step``: the tensors a graph reads, made once per shape and refilled per step;
- ``capture``: ``CudaGraph`` (a GPU) and ``EagerReplay`` (the CPU tests' stand-in);
- ``step_graphs``: ``StepGraphs``, which the runner asks first each step.
"""

from hybridkv.engine.graphs.capture import CudaGraph, EagerReplay, Graph
from hybridkv.engine.graphs.shapes import StepShape, bucket_sizes, span_class
from hybridkv.engine.graphs.static_step import StaticStep
from hybridkv.engine.graphs.step_graphs import StepGraphs, unsupported_reason

__all__ = [
    "CudaGraph",
    "EagerReplay",
    "Graph",
    "StaticStep",
    "StepGraphs",
    "StepShape",
    "bucket_sizes",
    "span_class",
    "unsupported_reason",
]
