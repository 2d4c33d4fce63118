"""``LLM``: the offline API (vLLM's names): load a checkpoint, ``generate``, ``chat``.

``model`` is a local checkpoint directory or a ``.gguf`` file; the KV cache is
planned from the model's layout (every layer kind gets its own group and manager)
and allocated once (``hybridkv.engine.preflight``: the checkpoint and the plan).
``kernel_backend`` (default: Triton on CUDA, the native C kernels on the CPU,
see ``engine_setup.resolve_kernel_backend``) is resolved once into a
``KernelBackend`` object (``self.kernel_backend``; ``describe()`` lists which
kernel runs each op) that every step's batch and the sampler use.
``cuda_graphs=True`` replays steps from CUDA graphs (``hybridkv.engine.graphs``: decode steps and
small steps (up to 511 new tokens) of every family on CUDA with the ``triton`` backend; anything
else is refused with the reason; ``runner.graphs.stats`` counts replays).
``async_scheduling=True`` schedules and fills the next step while one runs on the device
(``hybridkv.engine.async_step``; ``async_steps.stats`` counts the steps it could not overlap).
``kv_offloading_size`` / ``disk_cache_dir`` / ``disk_cache_size`` (GiB) put tiers under the
device pool, ``kv_store`` a shared Mooncake Store (``hybridkv.offload``, docs/tiers.md).
``kv_events_endpoint`` (or a whole ``kv_events_config``) publishes the cache's
BlockStored / BlockRemoved / AllBlocksCleared events in vLLM 0.33's ZMQ wire
format after every step (``hybridkv.events``, docs/kv_events.md; ``close()`` sends the rest).
The settings group into ``CacheConfig``, ``SchedulerConfig`` and
``ExecutionConfig`` (``hybridkv.engine.config``): pass them whole, or the
keyword arguments of their field names (same defaults); ``self.cache_config``
etc. hold what is in force. ``cache_policy`` is ``"lru"`` or ``"hybrid"`` (``KVCacheManager``);
``hybrid`` (a ``HybridOptions``) or the keywords ``hybrid_return_bonus``,
``hybrid_return_grade``, ``hybrid_value_weight``, ``hybrid_floor_tokens`` and
``hybrid_tuning`` (a ``HybridTuning`` or a dict of its fields) tune ``hybrid``
(None: the defaults; set under ``lru``, where they would change nothing, they are an error).
``hybridkv simulate`` compares these settings on one's own trace first.

The constructor checks its arguments before reading the checkpoint, and the
checkpoint and the KV plan before loading any weight (``preflight``): each
problem is a ``ValueError`` naming the argument or file.

Every input is checked before any request is queued, so a bad call leaves no
state behind; if a step fails, the call's requests are aborted and their
blocks freed before the error propagates.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.engine.async_step import AsyncSteps
from hybridkv.engine.config import (
    KEYWORDS,
    CacheConfig,
    ExecutionConfig,
    SchedulerConfig,
    build_configs,
)
from hybridkv.engine.engine_request import EngineRequest, request_output
from hybridkv.engine.engine_setup import resolve_device, resolve_kernel_backend
from hybridkv.engine.engine_step import run_step, schedule_step
from hybridkv.engine.graphs import StepGraphs
from hybridkv.engine.inputs import Prompt, PromptType, engine_requests, prompt_ids, sampling_list
from hybridkv.engine.lifetime import EngineLifetime
from hybridkv.engine.outputs import RequestOutput
from hybridkv.engine.preflight import preflight
from hybridkv.engine.runner import ModelRunner
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.scheduler import Scheduler, SchedulerOutput
from hybridkv.engine.tokenizer import encode_conversations
from hybridkv.events import KVEventsConfig, open_publisher
from hybridkv.events.config import resolve_events_config
from hybridkv.models.build import load_model
from hybridkv.models.layers.rotary import attach_rope_tables
from hybridkv.offload import build_tiered_cache, check_tier_settings, hybrid_with_tiers
from hybridkv.planning import allocate_kv_cache
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.specs import MambaSpec


class LLM(EngineLifetime):
    """A loaded model with its KV cache manager, scheduler and runner (its tiers, KV
    events publisher and frozen heap: ``EngineLifetime``, ``close``)."""

    def __init__(
        self,
        model: str | Path,
        *,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        block_size: int = 16,
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        preemption_mode: str | None = None,
        async_scheduling: bool = False,
        enable_prefix_caching: bool = True,
        kv_cache_memory_bytes: int | None = None,
        hash_algo: str = "sha256",
        cache_policy: str = "lru",
        hybrid_return_bonus: float | None = None,
        hybrid_return_grade: str | None = None,
        hybrid_value_weight: float | None = None,
        hybrid_floor_tokens: int | None = None,
        hybrid_tuning: HybridTuning | dict[str, Any] | None = None,
        hybrid: HybridOptions | None = None,
        kv_offloading_size: float | None = None,
        kv_offloading_backend: str = "native",
        disk_cache_dir: str | Path | None = None,
        disk_cache_size: float | None = None,
        kv_store: str | None = None,
        kernel_backend: str | None = None,
        cuda_graphs: bool = False,
        merge_projections: bool = True,
        allow_long_max_model_len: bool = False,
        progress: bool = False,
        kv_events_endpoint: str | None = None,
        kv_events_replay_endpoint: str | None = None,
        kv_events_topic: str | None = None,
        kv_events_config: KVEventsConfig | None = None,
        cache_config: CacheConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
        execution_config: ExecutionConfig | None = None,
    ) -> None:
        # Every argument is checked before the checkpoint is read, and the
        # checkpoint's files and the KV plan before any weight is loaded.
        events_config = resolve_events_config(
            kv_events_config, kv_events_endpoint, kv_events_replay_endpoint, kv_events_topic
        )
        keywords = {k: v for k, v in locals().items() if k in KEYWORDS}
        cache, sched, run = build_configs(
            cache_config, scheduler_config, execution_config, keywords
        )
        self.cache_config, self.scheduler_config, self.execution_config = cache, sched, run
        check_tier_settings(cache)  # a one-line TierError (disk folder, store) before any load
        self.device = resolve_device(run.device)
        self.kernel_backend = resolve_kernel_backend(run.kernel_backend, self.device)

        pre = preflight(
            model, cache, sched, run, self.device, self.kernel_backend, progress=progress
        )
        self.model_dir, self.hf_config = pre.model_dir, pre.hf_config
        self.text_config, self.dtype = pre.text_config, pre.dtype
        self.max_model_len, self.plan = pre.max_model_len, pre.plan
        self.max_num_batched_tokens = sched.max_num_batched_tokens
        self.tokenizer, self.eos_token_ids = pre.tokenizer, pre.eos_token_ids
        # What ``chat`` renders with when no chat_template is passed (None: chat is refused).
        self.chat_template = pre.chat_template

        self.model = load_model(
            self.model_dir,
            self.hf_config,
            self.dtype,
            self.device,
            progress=progress,
            amx=self.kernel_backend.amx_linears,
            merge=run.merge_projections,
        )
        attach_rope_tables(self.model, self.max_model_len)
        config = self.plan.kv_cache_config
        self.kv_cache_config = config
        self.kv_buffers = allocate_kv_cache(config, self.device)
        self.manager = KVCacheManager(
            config,
            self.max_model_len,
            enable_caching=cache.enable_prefix_caching,
            hash_algo=cache.hash_algo,
            log_stats=True,
            cache_policy=cache.cache_policy,
            hybrid=hybrid_with_tiers(cache, self.plan.available_memory_bytes),
            enable_kv_cache_events=events_config is not None,
        )
        self._hold_tiers(  # the host / disk tiers under the pool, or None
            build_tiered_cache(
                cache, self.manager, self.kv_buffers, self.model_dir, self.kernel_backend.name
            )
        )
        has_mamba = any(isinstance(g.kv_cache_spec, MambaSpec) for g in config.kv_cache_groups)
        self.scheduler = Scheduler(
            self.manager,
            max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            defer_pending_hits=has_mamba,
            tiers=self.tiers,
            preemption_mode=sched.preemption_mode,
        )
        self.runner = ModelRunner(
            self.model, config, self.kv_buffers, self.manager, self.device, self.kernel_backend
        )
        if run.cuda_graphs:
            self.runner.graphs = StepGraphs(self.runner, sched.max_num_seqs, self.max_model_len)
        #: The step in flight and its counters (``async_scheduling=True``), or None.
        self.async_steps = AsyncSteps(self.device) if sched.async_scheduling else None
        self._ids = itertools.count()
        self.num_steps = 0
        self.last_step: SchedulerOutput | None = None
        device = self.device.type  # the KV events publisher last: nothing after it can fail
        self._hold_events(
            None if events_config is None else open_publisher(events_config, config, device)
        )
        self._freeze_heap()

    # -- requests ----------------------------------------------------------------
    def _prompt_ids(self, prompt: PromptType, k: int) -> Prompt:
        return prompt_ids(
            prompt, k, self.tokenizer, self.text_config.vocab_size, self.max_model_len
        )

    def _make_requests(
        self,
        prompts: Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[list[EngineRequest]]:
        params = sampling_list(sampling_params, len(prompts), self.text_config.vocab_size)
        common = {"eos_token_ids": self.eos_token_ids, "max_model_len": self.max_model_len}
        return engine_requests(prompts, params, self._ids, arrival_time=time.monotonic(), **common)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs in prompt order, each with ``n`` samples.

        A prompt is text or a dict (``inputs.py``: ``prompt`` / ``prompt_token_ids``,
        and ``cache_salt`` as in vLLM); it returns once a ``kv_store`` has what they wrote."""
        if isinstance(prompts, str | Mapping):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a non-empty str, dict or list of them")
        encoded = [self._prompt_ids(p, k) for k, p in enumerate(prompts)]
        return self._run(self._make_requests(encoded, sampling_params), use_tqdm)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """Reply to one conversation or a list of them (the chat template renders each).

        ``chat_template`` (Jinja) replaces the tokenizer's, e.g. for a base model;
        without it, ``self.chat_template`` renders (``hybridkv.engine.chat_template``).
        """
        template = chat_template
        if template is None and self.chat_template is not None:
            template = self.chat_template.text
        ids = encode_conversations(self.tokenizer, messages, template)
        encoded = [self._prompt_ids({"prompt_token_ids": x}, k) for k, x in enumerate(ids)]
        return self._run(self._make_requests(encoded, sampling_params), use_tqdm)

    def make_requests(
        self, prompt: PromptType, sampling_params: SamplingParams | None = None
    ) -> list[EngineRequest]:
        """The checked engine requests of one prompt (its ``n`` samples, in order), not
        queued (for a serving loop; ``ValueError`` on bad input)."""
        return self._make_requests([self._prompt_ids(prompt, 0)], sampling_params)[0]

    # -- the engine loop -----------------------------------------------------------
    def step(self) -> SchedulerOutput:
        """Schedule, run and sample one step; returns what it scheduled (async
        scheduling: the steps whose tokens it applied, ``hybridkv.engine.async_step``).

        ``last_step`` holds that before the model runs, so a caller that
        catches a failed step knows which requests it concerned. With no
        request queued it does nothing (but apply a step in flight) and returns that.
        """
        self.last_step = None
        steps, scheduler, greedy = self.async_steps, self.scheduler, self.kernel_backend.greedy
        if not scheduler.has_unfinished():
            return SchedulerOutput((), ()) if steps is None else steps.settle(scheduler)
        if steps is None:
            out = schedule_step(scheduler, self.kv_cache_config.num_blocks)
            self.last_step = out
            run_step(out, scheduler, self.runner, greedy)
        else:
            try:
                out = steps.step(scheduler, self.runner, greedy, self.kv_cache_config.num_blocks)
            finally:
                self.last_step = steps.last
        self.num_steps += 1
        self.publish_kv_events()
        return out

    def _run(self, groups: list[list[EngineRequest]], use_tqdm: bool) -> list[RequestOutput]:
        requests = [r for group in groups for r in group]
        for req in requests:
            self.scheduler.add_request(req)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(requests), desc="generating", unit="req", dynamic_ncols=True)
        try:
            while any(not r.status.finished for r in requests):
                self.step()
                if bar is not None:
                    bar.update(sum(r.status.finished for r in requests) - bar.n)
        except BaseException:
            for req in requests:
                self.scheduler.abort(req.request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        if self.tiers is not None:  # a next turn, on any replica, finds what they wrote
            self.tiers.store_barrier().wait()
        tok = self.tokenizer
        decode = None if tok is None else lambda ids: tok.decode(ids, skip_special_tokens=True)
        return [request_output(group, decode) for group in groups]
