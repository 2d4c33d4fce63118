"""CUDA graphs of decode steps: one replay instead of hundreds of kernel launches.

Why: on an H100 a decode step of Gemma 3 270M (64 requests) took 17.7 ms, with the
GPU busy 1.4 ms of the model's 14.1 ms: the step is bound by the host launching
about 300 kernels, not by the GPU (``benchmarks/results/engine-nvidia-h100-bfloat16-random.md``).
A CUDA graph records a step's launches once and replays them with one call.

**What is captured.** A step whose every request adds one token and samples (a
decode step) is padded to a *bucket* batch size (1, 2, 4, 8, then multiples of 8 up
to ``max_batch``) and run over *static* inputs: token ids, positions, and per
attention group the ``AttentionMetadata`` device tensors (query starts, sequence
lengths, block table) and the slot mapping. One graph is captured per (bucket,
*span class*) the first time such a step comes: the span class (a power of two of
at least 2,048 keys, at most ``max_model_len``) is what the attention launcher
plans the split-KV launch for, so the plan baked into a graph suits the contexts
it replays. A replay copies the step's values into the static tensors, replays,
and returns the first ``len(work)`` rows of the static logits.

**Padding rows** are harmless: each is a one-token sequence of length 1 whose slot
mapping is -1 (no cache write) and whose block-table row is whatever the static
table holds (a valid block id: its key is read and the row's output dropped).

**What a graph needs of the model and kernels**, checked at construction
(``unsupported_reason``): the model says ``supports_cuda_graphs`` (no host reads in
its forward: Gemma 3; Llama 4's MoE routing and Jamba's experts and Mamba layers
read the host); only attention groups; the ``triton`` kernel backend, whose decode
path reads the lengths and tables from the device tensors only (the torch and
native backends build index plans on the host from the metadata's host lists,
which a replay would not update).

Everything else (prefill and mixed steps, batches over ``max_batch``) runs eagerly;
``stats`` counts replays, captures and eager steps by reason. ``graph_factory``
makes the graphs: ``CudaGraph`` on a GPU; ``EagerReplay`` re-runs the captured
function over the same static inputs, so that the CPU tests check the padding, the
static buffers and the stale host values a replay keeps.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hybridkv.engine.scheduler import ScheduledRequest
from hybridkv.kernels import AttentionMetadata
from hybridkv.models.batch import AttentionLayerInputs, ForwardBatch, StepValues
from hybridkv.planning import AttentionCache
from hybridkv.specs import AttentionSpec

#: The smallest span class: contexts up to this share one plan.
MIN_SPAN = 2048
#: Warm-up runs before a capture (compiles Triton kernels, builds the launch plans).
WARMUP_RUNS = 2


class Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def replay(self) -> None: ...


class CudaGraph:
    """A ``torch.cuda.CUDAGraph`` over ``fn``, warmed up on a side stream first."""

    def __init__(self, device: torch.device, pool: Any) -> None:
        self.device = device
        self.pool = pool
        self.graph: Any = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


class EagerReplay:
    """Runs ``fn`` again at each replay and writes its result where the first run's
    went: what a graph does, minus the launch savings (the CPU tests' graph)."""

    def __init__(self) -> None:
        self.fn: Callable[[], torch.Tensor] | None = None
        self.out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self) -> None:
        assert self.fn is not None and self.out is not None
        self.out.copy_(self.fn())


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, 32, ... up to ``max_batch`` (always included)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch]
    sizes += range(8, max_batch, 8)
    return (*sizes, max_batch)


def span_class(max_seq_len: int, max_model_len: int, min_span: int = MIN_SPAN) -> int:
    """The power of two (at least ``min_span``) a step's longest context plans for,
    at most ``max_model_len``."""
    span = min_span
    while span < max_seq_len:
        span *= 2
    return min(span, max_model_len)


@dataclass
class _Static:
    """One captured graph's inputs and output."""

    graph: Graph
    batch: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    metas: list[AttentionMetadata]  # per attention group, in group order
    slots: list[torch.Tensor]  # per attention group
    logits: torch.Tensor | None = None


def unsupported_reason(model: Any, config: Any, backend_name: str, device: torch.device) -> str:
    """Why decode steps of this engine cannot be graphed ('' when they can); ``model``
    a ``CausalLM`` or its class."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type!r}"
    if backend_name != "triton":
        return (
            f"CUDA graphs need kernel_backend='triton' (the {backend_name!r} backend plans "
            "its decode launches on the host)"
        )
    if not getattr(model, "supports_cuda_graphs", False):
        name = model.__name__ if isinstance(model, type) else type(model).__name__
        return (
            f"{name} reads host values in its forward (MoE routing or Mamba layers): "
            "its steps cannot be captured"
        )
    for g in config.kv_cache_groups:
        if not isinstance(g.kv_cache_spec, AttentionSpec):
            return f"group of {type(g.kv_cache_spec).__name__}: only attention groups are graphed"
    return ""


class DecodeGraphs:
    """Captures and replays decode steps (see the module docstring)."""

    def __init__(
        self,
        runner: Any,
        max_batch: int,
        max_model_len: int,
        graph_factory: Callable[[], Graph] | None = None,
    ) -> None:
        self.runner = runner
        self.buckets = bucket_sizes(max_batch)
        self.max_model_len = max_model_len
        #: The smallest span class (a power of two; tests lower it).
        self.min_span = MIN_SPAN
        self.groups = list(runner.config.kv_cache_groups)
        for g in self.groups:
            if not isinstance(g.kv_cache_spec, AttentionSpec):
                raise ValueError(f"{type(g.kv_cache_spec).__name__} groups cannot be graphed")
        if graph_factory is None:
            pool = torch.cuda.graph_pool_handle()
            device = runner.device

            def graph_factory() -> Graph:
                return CudaGraph(device, pool)

        self.graph_factory = graph_factory
        self.graphs: dict[tuple[int, int], _Static] = {}
        self.stats: collections.Counter[str] = collections.Counter()

    # -- which steps ------------------------------------------------------------------
    def _bucket(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def eager_reason(self, work: Sequence[ScheduledRequest]) -> str:
        """Why this step runs eagerly ('' when it replays a graph)."""
        if not work:
            return "empty step"
        if any(s.num_tokens != 1 or not s.samples for s in work):
            return "prefill or mixed step"
        if self._bucket(len(work)) is None:
            return f"batch over {self.buckets[-1]}"
        return ""

    # -- capture ----------------------------------------------------------------------
    def _make(self, batch: int, span: int) -> _Static:
        dev = self.runner.device
        metas, slots = [], []
        for g in self.groups:
            bs = g.kv_cache_spec.block_size
            width = -(-self.max_model_len // bs)
            table = torch.zeros((batch, width), dtype=torch.int32)
            metas.append(AttentionMetadata.build([1] * batch, [span] * batch, table, dev))
            slots.append(torch.full((batch,), -1, dtype=torch.int64, device=dev))
        static = _Static(
            graph=self.graph_factory(),
            batch=batch,
            input_ids=torch.zeros(batch, dtype=torch.int64, device=dev),
            positions=torch.full((batch,), span - 1, dtype=torch.int64, device=dev),
            metas=metas,
            slots=slots,
        )
        rows = torch.arange(batch, dtype=torch.int64, device=dev)
        buffers = self.runner.buffers.layers
        attention: dict[str, AttentionLayerInputs] = {}
        for g, meta, slot in zip(self.groups, metas, slots, strict=True):
            for name in g.layer_names:
                cache = buffers[name]
                assert isinstance(cache, AttentionCache)
                attention[name] = AttentionLayerInputs(meta, slot, cache)
        model, ops = self.runner.model, self.runner.ops
        starts = tuple(range(batch + 1))

        def step() -> torch.Tensor:
            # A fresh StepValues each run: the RoPE tables are computed from the static
            # positions inside the captured region, never carried over.
            fb = ForwardBatch(
                input_ids=static.input_ids,
                positions=static.positions,
                query_starts_cpu=starts,
                logits_indices=rows,
                ops=ops,
                attention=attention,
                mamba={},
                step=StepValues(),
            )
            return model.compute_logits(model(fb)[rows])

        with torch.inference_mode():
            static.logits = static.graph.capture(step)
        self.stats["captures"] += 1
        return static

    # -- replay -----------------------------------------------------------------------
    def run(self, work: Sequence[ScheduledRequest]) -> torch.Tensor | None:
        """The step's logits ``[len(work), vocab]`` from a graph, or None when the step
        must run eagerly (``eager_reason``; counted in ``stats``)."""
        why = self.eager_reason(work)
        if why:
            self.stats[f"eager: {why}"] += 1
            return None
        n = len(work)
        bucket = self._bucket(n)
        assert bucket is not None
        seq_lens = [s.start + 1 for s in work]
        key = (bucket, span_class(max(seq_lens), self.max_model_len, self.min_span))
        static = self.graphs.get(key)
        if static is None:
            static = self.graphs[key] = self._make(*key)
        self._fill(static, work, seq_lens)
        static.graph.replay()
        self.stats["replays"] += 1
        assert static.logits is not None
        return static.logits[:n]

    def _fill(self, static: _Static, work: Sequence[ScheduledRequest], seq_lens: list[int]) -> None:
        pad = static.batch - len(work)
        positions = [s.start for s in work]
        tokens = [s.request.core.all_token_ids[s.start] for s in work]
        ids = [self.runner.manager.get_block_ids(s.request.request_id) for s in work]
        static.input_ids.copy_(torch.tensor(tokens + [0] * pad, dtype=torch.int64))
        static.positions.copy_(torch.tensor(positions + [0] * pad, dtype=torch.int64))
        for g, (group, meta, slot) in enumerate(
            zip(self.groups, static.metas, static.slots, strict=True)
        ):
            bs = group.kv_cache_spec.block_size
            rows = [row[g] for row in ids]
            width = max(len(r) for r in rows)
            table = torch.tensor(
                [r + [0] * (width - len(r)) for r in rows] + [[0] * width] * pad,
                dtype=torch.int32,
            )
            meta.block_table[:, :width].copy_(table)
            meta.seq_lens.copy_(torch.tensor(seq_lens + [1] * pad, dtype=torch.int32))
            slot_ids = [r[p // bs] * bs + p % bs for r, p in zip(rows, positions, strict=True)]
            slot.copy_(torch.tensor(slot_ids + [-1] * pad, dtype=torch.int64))
