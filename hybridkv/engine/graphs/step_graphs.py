"""``StepGraphs``: the engine's steps replayed from CUDA graphs, captured on first use.

Why: on an H100 a decode step of Gemma 3 270M (64 requests) took 17.7 ms with the GPU
busy 1.4 ms of the model's 14.1 ms, and the step a prefix hit leaves (one request,
36 new tokens) 13 ms: both are bound by the host launching about 300 kernels, not by
the GPU (``benchmarks/results/engine-nvidia-h100-bfloat16-random.md``). A graph
records a step's launches once and replays them with one call.

``run(work)`` finds the step's padded shape (``shapes.StepShape``: decode steps and
small steps of any mix), captures a graph for a new shape (its ``StaticStep``
tensors made once), fills the tensors with the step's values and replays; it returns
None for a step that runs eagerly, counting why in ``stats``. Graphs are captured
lazily, each on the first step of its shape (a stall of three forward passes: two
warm-ups and the capture); an engine meets at most sequence buckets x (1 + token
buckets) x span classes of them (with ``max_num_seqs`` 64 and ``max_model_len``
32,768: 12 x 7 x 7), and sees far fewer (a decode batch's bucket changes as requests
come and go; small steps are what arrivals and prefix hits make).

What a graph needs (``unsupported_reason``, checked by ``LLM(cuda_graphs=True)``
before any weight is loaded): a CUDA device; the ``triton`` kernel backend, whose
launches read lengths and tables from the metadata's device tensors (the torch and
native backends build index plans on the host from its host lists, which a replay
does not rewrite); a model whose forward reads nothing back from the device when
``ForwardBatch.graphed`` (``CausalLM.supports_cuda_graphs``: every family; the
routed experts of Llama 4, Jamba and Granite take their dense form, see
``models/layers/moe.py``); attention and Mamba groups (the Mamba kernels read their
state slots from the static tensors).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hybridkv.engine.graphs.capture import CudaGraph, Graph
from hybridkv.engine.graphs.shapes import MIN_SPAN, StepShape, bucket_sizes
from hybridkv.engine.graphs.static_step import StaticStep
from hybridkv.engine.pending import PendingTokens
from hybridkv.engine.scheduler import ScheduledRequest
from hybridkv.specs import AttentionSpec, MambaSpec


def unsupported_reason(model: Any, config: Any, backend_name: str, device: torch.device) -> str:
    """Why this engine's steps cannot be graphed ('' when they can); ``model`` a
    ``CausalLM`` or its class, ``config`` its ``KVCacheConfig``."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type!r}"
    if backend_name != "triton":
        return (
            f"CUDA graphs need kernel_backend='triton' (the {backend_name!r} backend plans "
            "its launches on the host)"
        )
    if not getattr(model, "supports_cuda_graphs", False):
        name = model.__name__ if isinstance(model, type) else type(model).__name__
        return f"{name} reads host values in its forward: its steps cannot be captured"
    for g in config.kv_cache_groups:
        if not isinstance(g.kv_cache_spec, AttentionSpec | MambaSpec):
            return (
                f"group of {type(g.kv_cache_spec).__name__}: only attention and Mamba groups "
                "are graphed"
            )
    return ""


class StepGraphs:
    """Captures and replays an engine's steps (see the module docstring)."""

    def __init__(
        self,
        runner: Any,
        max_batch: int,
        max_model_len: int,
        graph_factory: Callable[[], Graph] | None = None,
    ) -> None:
        self.runner = runner
        self.buckets = bucket_sizes(max_batch + 1)  # + room for a padding sequence
        self.max_model_len = max_model_len
        #: The smallest span class (a power of two; tests lower it).
        self.min_span = MIN_SPAN
        self.groups = list(runner.config.kv_cache_groups)
        for g in self.groups:
            if not isinstance(g.kv_cache_spec, AttentionSpec | MambaSpec):
                raise ValueError(f"{type(g.kv_cache_spec).__name__} groups cannot be graphed")
        if graph_factory is None:
            pool = torch.cuda.graph_pool_handle()
            device = runner.device

            def graph_factory() -> Graph:
                return CudaGraph(device, pool)

        self.graph_factory = graph_factory
        self.graphs: dict[StepShape, tuple[Graph, StaticStep, torch.Tensor]] = {}
        self.stats: collections.Counter[str] = collections.Counter()

    def shape(self, work: Sequence[ScheduledRequest]) -> StepShape | str:
        """The shape ``work`` replays at, or why it runs eagerly."""
        return StepShape.of(work, self.buckets, self.max_model_len, self.min_span)

    def _capture(self, shape: StepShape) -> tuple[Graph, StaticStep, torch.Tensor]:
        runner = self.runner
        static = StaticStep.make(
            shape, self.groups, runner.buffers, self.max_model_len, runner.device
        )
        graph = self.graph_factory()
        model, ops = runner.model, runner.ops
        logits = graph.capture(lambda: static.forward(model, ops))
        self.stats["captures"] += 1
        return graph, static, logits

    @torch.inference_mode()  # the static tensors are inference tensors, whoever calls
    def run(
        self, work: Sequence[ScheduledRequest], pending: PendingTokens | None = None
    ) -> torch.Tensor | None:
        """The step's logits ``[sampling requests, vocab]`` from a graph, in batch order,
        or None when the step runs eagerly (counted in ``stats``); ``pending``: the step
        in flight's sampled ids (async scheduling, ``StaticStep.fill``)."""
        shape = self.shape(work)
        if isinstance(shape, str):
            self.stats[f"eager: {shape}"] += 1
            return None
        found = self.graphs.get(shape)
        if found is None:
            found = self.graphs[shape] = self._capture(shape)
        graph, static, logits = found
        sampled = static.fill(work, self.runner.block_ids(work), pending)
        graph.replay()
        self.stats["decode replays" if shape.decode else "small-step replays"] += 1
        return logits[:sampled]
