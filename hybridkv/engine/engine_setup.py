"""Resolving the ``LLM`` constructor's arguments: dtype, device, kernels, EOS ids, the
KV layout and memory.

Each helper validates one argument and raises ``ValueError`` naming it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from hybridkv.kernels import KernelBackend, get_backend
from hybridkv.kernels.backend import backend_from_environment
from hybridkv.kernels.cpu import native_status
from hybridkv.layouts import ModelLayout, layout_from_hf_config
from hybridkv.layouts.context_length import check_max_model_len, rope_scaling_types
from hybridkv.planning import PagePlan

DEFAULT_KV_CAP_BYTES = 2 << 30
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_dtype(dtype: Any) -> None:
    """``dtype`` is ``"auto"``, a supported name or a supported ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")
    elif dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported: 'auto' or one of {sorted(_DTYPES)}")


def resolve_dtype(dtype: str | torch.dtype, text_config: Any) -> torch.dtype:
    check_dtype(dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        cfg = getattr(text_config, "dtype", None) or getattr(text_config, "torch_dtype", None)
        name = str(cfg).removeprefix("torch.") if cfg is not None else "float32"
        return _DTYPES.get(name, torch.float32)
    return _DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` (CUDA when available, else the CPU), ``"cpu"`` or ``"cuda[:N]"``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"device {device!r} is not a device: pass 'auto', 'cpu' or 'cuda[:N]'"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported: pass 'auto', 'cpu' or 'cuda[:N]'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but CUDA is not available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {device!r}: there are only {torch.cuda.device_count()} CUDA devices"
        )
    return dev


def resolve_kernel_backend(requested: str | None, device: torch.device) -> KernelBackend:
    """The kernel backend every op of the engine's steps runs on, resolved once.

    ``requested`` (or ``$HYBRIDKV_KERNEL_BACKEND``) is checked here, so that a
    backend that cannot run fails at construction (``KernelBackendError``), not
    mid-generation. Without either: Triton on CUDA; on the CPU the native C
    kernels (``hybridkv.kernels.cpu``: fused Gemma 3 layers, paged decode
    attention), or, where they cannot be built, the torch reference with a
    ``RuntimeWarning`` that says why and what it costs.
    """
    if requested is not None or backend_from_environment() is not None:
        return get_backend(requested, device)
    if device.type != "cpu":
        return get_backend(None, device)
    why = native_status()
    if why is None:
        return get_backend("native", device)
    warnings.warn(
        f"the native CPU kernels are unavailable ({why}); running the torch reference "
        "kernels instead, which are slower (kernel_backend='torch' silences this)",
        RuntimeWarning,
        stacklevel=3,
    )
    return get_backend("torch", device)


def positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def check_flag(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def eos_token_ids(model_dir: Path, text_config: Any) -> frozenset[int]:
    """End-of-sequence ids: ``generation_config.json``'s, else the config's (may be none)."""
    from transformers import GenerationConfig

    eos: Any = None
    if (model_dir / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(str(model_dir), local_files_only=True).eos_token_id
    elif getattr(text_config, "eos_token_id", None) is not None:
        eos = text_config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def kv_layout(
    hf_config: Any,
    text_config: Any,
    dtype: torch.dtype,
    max_model_len: int | None,
    allow_long: bool,
    model: str,
) -> ModelLayout:
    """The checkpoint's layout as the KV plan takes it: the cache in ``dtype``;
    ``max_model_len`` (None: the model's) checked against the model's positions
    (``allow_long``: ``allow_long_max_model_len``) and applied; a float32 model
    keeps its Mamba state in float32 unless the checkpoint names a dtype."""
    layout = layout_from_hf_config(hf_config, cache_dtype=str(dtype).removeprefix("torch."))
    if max_model_len is not None:
        check_max_model_len(
            max_model_len,
            layout.max_model_len,
            model=model,
            rope_scaling=rope_scaling_types(text_config),
            allow_long=allow_long,
        )
        layout = layout.model_copy(update={"max_model_len": max_model_len})
    if layout.mamba_ssm_dtype is None and dtype == torch.float32:
        layout = layout.model_copy(update={"mamba_ssm_dtype": "float32"})
    return layout


def default_kv_bytes(pages: PagePlan, max_num_seqs: int) -> int:
    """Room for ``max_num_seqs`` full-length requests, capped at ``DEFAULT_KV_CAP_BYTES``
    but never below one full-length request plus a step's worth of blocks.

    Read off the plan's pages (``plan_pages``), which need no budget: the
    engine plans once and fits that plan to this many bytes (``fit_memory``).
    """
    per_request = pages.bytes_per_request
    steps = 2 + pages.max_num_batched_tokens // pages.block_size
    floor = per_request + pages.page_bytes * steps
    return max(min(per_request * max_num_seqs, DEFAULT_KV_CAP_BYTES), floor)
