"""``load_model``: config -> model class -> empty model -> strict weights.

The model is built on the ``meta`` device (no random init of weights that are
about to be overwritten), materialised on ``device`` in ``dtype``, then filled
by the strict loader. Modules holding derived, non-checkpoint buffers (RoPE
inverse frequencies) expose ``init_buffers()``, called after materialising.
Once loaded, the projections of one input become one GEMM (``qkv_proj``,
``gate_up_proj``: ``layers.merged_linear``; ``merge=False`` keeps them apart), then CPU
bf16 linear layers are re-laid out for oneDNN
(``layers.packed_linear``; bit-identical results, weights held twice), and with
``amx=True`` also for the AMX decode kernel where the CPU has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hybridkv.models.base import CausalLM
from hybridkv.models.layers.merged_linear import merge_projections
from hybridkv.models.layers.packed_linear import pack_linears
from hybridkv.models.loader import load_checkpoint
from hybridkv.models.registry import resolve_architecture


def build_model(hf_config: Any, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """An empty (uninitialised) model for ``hf_config`` on ``device`` in ``dtype``."""
    cls, text_config = resolve_architecture(hf_config)
    with torch.device("meta"):
        model = cls(text_config)
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()
    for module in model.modules():
        init = getattr(module, "init_buffers", None)
        if callable(init):
            init()
    return model.eval()


def load_model(
    model_dir: Path,
    hf_config: Any,
    dtype: torch.dtype,
    device: torch.device,
    *,
    progress: bool = False,
    amx: bool = False,
    merge: bool = True,
) -> CausalLM:
    """The model of ``model_dir`` with its weights loaded strictly."""
    model = build_model(hf_config, dtype, device)
    load_checkpoint(model, model_dir, dtype, progress=progress)
    if merge:
        merge_projections(model)
    pack_linears(model, amx=amx)
    return model
