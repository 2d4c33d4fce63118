"""Rotary position embeddings (``rotate_half`` form) with HF's scaling rules.

``rope_inv_freq(head_dim, params)`` reads one Hugging Face rope parameter dict
(``rope_theta``, ``rope_type`` in ``default | linear | llama3`` and that type's
fields) and returns the inverse frequencies; any other type raises
``ValueError``. ``RotaryEmbedding.cos_sin(positions)`` then ``rotate(x, cos, sin)`` rotate ``x``
``[T, H, D]`` at integer ``positions`` ``[T]``: cos/sin are computed in fp32
and cast to ``x``'s dtype, as Hugging Face does. ``for_step`` shares them among a
step's layers; once ``attach_rope_tables(model, max_model_len)`` has run (the engine
does it), a step gathers them from a ``RopeTable`` computed once (``rope_table.py``)
instead of computing them at its positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hybridkv.kernels.torch_backend import apply_rope
from hybridkv.models.layers.rope_table import RopeTable, table_fits

if TYPE_CHECKING:
    from hybridkv.models.batch import ForwardBatch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (fp32) for one rope parameter dict."""
    base = float(params["rope_theta"])
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(params["factor"])
    if kind == "llama3":
        return _llama3(inv, params)
    raise ValueError(f"rope_type {kind!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")


def _llama3(inv: torch.Tensor, p: Mapping[str, Any]) -> torch.Tensor:
    factor = float(p["factor"])
    low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_parameters(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope dict of a config (of ``layer_type`` where it is nested per layer type).

    Reads transformers 5's ``rope_parameters`` (flat, or keyed by layer type as in
    Gemma 3), else the older ``rope_theta`` / ``rope_scaling`` /
    ``rope_local_base_freq`` fields.
    """
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, Mapping):
        if layer_type is not None and layer_type in params:
            return dict(params[layer_type])
        if "rope_theta" in params:
            return dict(params)
    if layer_type == "sliding_attention" and hasattr(config, "rope_local_base_freq"):
        return {"rope_theta": config.rope_local_base_freq, "rope_type": "default"}
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    return {"rope_theta": config.rope_theta, "rope_type": "default", **scaling}


class RopeFrequencies(nn.Module):
    """Holds ``inv_freq`` (fp32, not in checkpoints) for one head size and rope dict."""

    def __init__(self, head_dim: int, params: Mapping[str, Any]) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.params = dict(params)
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, params), persistent=False)
        self.inv_freq: torch.Tensor
        #: cos/sin of every position, shared with same-form layers (``attach_rope_tables``);
        #: None: each step computes them at its positions.
        self.table: RopeTable | None = None

    #: Each RoPE form defines ``cos_sin(positions, ...) -> (cos, sin)``.
    cos_sin: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def init_buffers(self) -> None:
        """Recompute the inverse frequencies (after building on the meta device)."""
        self.inv_freq = rope_inv_freq(self.head_dim, self.params).to(self.inv_freq.device)

    def form_key(self) -> tuple[object, ...]:
        """What makes two layers' cos/sin equal: the form, head size and rope dict."""
        return (type(self).__name__, self.head_dim, repr(sorted(self.params.items())))

    def for_step(self, batch: ForwardBatch, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos_sin(batch.positions, *args)``, once per step for all layers with the
        same RoPE form and parameters (kept in ``batch.step.rope``): gathered from
        ``self.table`` where one is attached, else computed."""
        key = (*self.form_key(), *args)
        tables = batch.step.rope
        found = tables.get(key)
        if found is None:
            if self.table is None:
                found = self.cos_sin(batch.positions, *args)
            else:
                check = not batch.graphed
                if check and batch.attention:  # host ints: a step's last token is at seq_len - 1
                    inputs = batch.attention.values()
                    self.table.require(max(max(a.metadata.seq_lens_cpu) for a in inputs) - 1)
                    check = False
                found = self.table.gather(batch.positions, self.cos_sin, *args, check=check)
            tables[key] = found
        return found


def attach_rope_tables(model: nn.Module, max_positions: int) -> dict[tuple[object, ...], RopeTable]:
    """Give every RoPE module of ``model`` a ``RopeTable`` of ``max_positions`` positions,
    one table shared by the modules of one form (``form_key``); returns them by form.
    Memory: see ``rope_table.py`` (built on first use, per dtype); a form whose table
    would not fit (``table_fits``) gets none and computes its cos/sin per step."""
    tables: dict[tuple[object, ...], RopeTable] = {}
    for module in model.modules():
        if isinstance(module, RopeFrequencies) and table_fits(max_positions, module.head_dim):
            key = module.form_key()
            if key not in tables:
                tables[key] = RopeTable(max_positions)
            module.table = tables[key]
    return tables


class RotaryEmbedding(RopeFrequencies):
    """RoPE over the whole head (``rotate_half`` layout)."""

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, 1, D]`` in ``dtype`` (compute once, apply to q and k)."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[T, H, D]`` with precomputed cos/sin (the torch reference's)."""
        return apply_rope(x, cos, sin)
