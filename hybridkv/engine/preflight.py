"""``preflight``: the checkpoint and the KV plan, read and checked before any weight loads.

``LLM`` checks its arguments first (``engine/config.py``, the tier settings, the
device and kernel backend), then calls ``preflight``, which reads the rest:

- the checkpoint: ``model`` is a local directory (config.json + safetensors, with
  or without a tokenizer) or a ``.gguf`` file (converted once to a cached
  safetensors checkpoint, ``hybridkv.models.gguf``); config.json names a supported
  architecture, the safetensors headers are sound, the tokenizer files load;
- the KV layout: ``max_model_len`` beyond the model's positions is refused
  (``hybridkv.layouts.context_length``; ``allow_long_max_model_len=True`` overrides
  it for models that scale RoPE);
- the KV plan: ``plan_pages`` + ``fit_memory`` (once) from the model's layout, every
  layer kind its own group; ``kv_cache_memory_bytes`` defaults to room for
  ``max_num_seqs`` requests of ``max_model_len`` tokens, capped at
  ``engine_setup.DEFAULT_KV_CAP_BYTES`` (but never below one full-length request);
- ``cuda_graphs=True``: refused with the reason where steps cannot be graphed.

Each problem is a ``ValueError`` naming the argument or file. Nothing is loaded
or allocated: a refused ``LLM`` costs no weight load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridkv.engine.chat_template import ChatTemplate, default_chat_template
from hybridkv.engine.config import CacheConfig, ExecutionConfig, SchedulerConfig
from hybridkv.engine.engine_setup import default_kv_bytes, eos_token_ids, kv_layout, resolve_dtype
from hybridkv.engine.graphs import unsupported_reason
from hybridkv.engine.model_source import resolve_model_dir
from hybridkv.engine.tokenizer import load_tokenizer
from hybridkv.kernels import KernelBackend
from hybridkv.layouts.hf_import import read_hf_config
from hybridkv.models.safetensors_check import check_weight_files
from hybridkv.planning import KVCachePlan, fit_memory, plan_pages


@dataclass(frozen=True, slots=True)
class Preflight:
    """What ``preflight`` read: the engine builds from it."""

    model_dir: Path
    hf_config: Any
    #: The text model's config (``hf_config`` itself, or its ``text_config``).
    text_config: Any
    #: The model family's class (``hybridkv.models.registry``).
    model_cls: type
    dtype: torch.dtype
    #: ``max_model_len`` in force (the model's when not given).
    max_model_len: int
    #: None without tokenizer files.
    tokenizer: Any
    #: What ``chat`` renders with when no chat_template is passed (None: chat is refused).
    chat_template: ChatTemplate | None
    eos_token_ids: frozenset[int]
    plan: KVCachePlan


def preflight(
    model: str | Path,
    cache: CacheConfig,
    sched: SchedulerConfig,
    run: ExecutionConfig,
    device: torch.device,
    kernel_backend: KernelBackend,
    *,
    progress: bool = False,
) -> Preflight:
    """Read and check ``model``'s checkpoint and plan its KV cache under the settings
    (see the module docstring); ``device`` and ``kernel_backend`` are resolved."""
    model_dir = resolve_model_dir(model, progress=progress)
    from hybridkv.models.registry import check_architecture, resolve_architecture

    check_architecture(model_dir / "config.json")
    hf_config = read_hf_config(model_dir / "config.json")

    model_cls, text_config = resolve_architecture(hf_config)
    dtype = resolve_dtype(run.dtype, text_config)
    layout = kv_layout(
        hf_config,
        text_config,
        dtype,
        sched.max_model_len,
        sched.allow_long_max_model_len,
        str(model_dir),
    )
    check_weight_files(model_dir)
    tokenizer = load_tokenizer(model_dir)
    chat_template = default_chat_template(tokenizer, model_dir)
    eos = eos_token_ids(model_dir, text_config)
    pages = plan_pages(
        layout,
        block_size=cache.block_size,
        max_model_len=layout.max_model_len,
        max_num_batched_tokens=sched.max_num_batched_tokens,
    )
    memory = cache.kv_cache_memory_bytes or default_kv_bytes(pages, sched.max_num_seqs)
    plan = fit_memory(pages, memory)
    if run.cuda_graphs:
        why = unsupported_reason(model_cls, plan.kv_cache_config, kernel_backend.name, device)
        if why:
            raise ValueError(f"cuda_graphs=True: {why}")
    return Preflight(
        model_dir,
        hf_config,
        text_config,
        model_cls,
        dtype,
        layout.max_model_len,
        tokenizer,
        chat_template,
        eos,
        plan,
    )
