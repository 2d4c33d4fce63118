"""``ModelLayout``: the KV-relevant shape of a model, layer by layer.

A layout gives the model's name, where its dimensions come from (``source``),
the cache dtype, its maximum context, and one layer kind per layer, either as
an explicit ``layers`` list or as a ``pattern`` repeated (and cut) to
``num_layers``. List entries are a kind name from ``layer_kinds`` or an inline
kind. Example (Gemma 3 27B: five sliding layers, then one full)::

    name: gemma-3-27b
    source: https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json
    cache_dtype: bfloat16
    max_model_len: 131072
    layer_kinds:
      local: {kind: sliding_window, sliding_window: 1024, num_kv_heads: 16, head_dim: 128}
      global: {kind: full, num_kv_heads: 16, head_dim: 128}
    pattern: [local, local, local, local, local, global]
    num_layers: 62

Layers are named ``layers.{i}`` (0-based) in the specs it produces.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybridkv.layouts.kinds import LayerKind, PositiveInt
from hybridkv.specs import KVCacheSpec
from hybridkv.specs.dtypes import dtype_name

LayerEntry = str | LayerKind


def layer_name(index: int) -> str:
    """The name of layer ``index`` in specs, groups and tensors."""
    return f"layers.{index}"


class ModelLayout(BaseModel):
    """A validated model layout (see the module docstring for the format)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    source: str | None = None
    cache_dtype: str = "bfloat16"
    mamba_ssm_dtype: str | None = None
    max_model_len: PositiveInt
    layer_kinds: dict[str, LayerKind] = Field(default_factory=dict)
    layers: list[LayerEntry] | None = None
    pattern: list[LayerEntry] | None = None
    num_layers: PositiveInt | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelLayout:
        for field in ("cache_dtype", "mamba_ssm_dtype"):
            value = getattr(self, field)
            if value is not None:
                dtype_name(value, field)
        if (self.layers is None) == (self.pattern is None):
            raise ValueError("give exactly one of 'layers' (explicit) or 'pattern' (repeated)")
        if self.pattern is not None:
            if self.num_layers is None:
                raise ValueError("'pattern' needs 'num_layers' (the pattern repeats to it)")
            if not self.pattern:
                raise ValueError("'pattern' must hold at least one layer")
        if self.layers is not None:
            if not self.layers:
                raise ValueError("'layers' must hold at least one layer")
            if self.num_layers is not None and self.num_layers != len(self.layers):
                raise ValueError(
                    f"'num_layers' is {self.num_layers} but 'layers' lists {len(self.layers)}"
                )
        entries = self.layers if self.layers is not None else self.pattern
        assert entries is not None
        for i, entry in enumerate(entries):
            if isinstance(entry, str) and entry not in self.layer_kinds:
                where = "layers" if self.layers is not None else "pattern"
                raise ValueError(
                    f"{where}[{i}]: unknown layer kind {entry!r}; define it under "
                    f"'layer_kinds' (defined: {sorted(self.layer_kinds) or 'none'})"
                )
        if not any(k.is_attention or k.is_mamba for k in self.resolved_layers):
            raise ValueError("the layout has no layer with a KV cache or Mamba state")
        return self

    @cached_property
    def resolved_layers(self) -> tuple[LayerKind, ...]:
        """One kind per layer, with names resolved and the pattern expanded."""
        if self.layers is not None:
            entries = self.layers
        else:
            assert self.pattern is not None and self.num_layers is not None
            reps = -(-self.num_layers // len(self.pattern))
            entries = (self.pattern * reps)[: self.num_layers]
        return tuple(self.layer_kinds[e] if isinstance(e, str) else e for e in entries)

    @property
    def total_layers(self) -> int:
        return len(self.resolved_layers)

    @property
    def dtype(self) -> str:
        """The canonical name of ``cache_dtype`` (``specs/dtypes.py``)."""
        return dtype_name(self.cache_dtype, "cache_dtype")

    @property
    def ssm_dtype(self) -> str:
        """The canonical name of the Mamba SSM state's dtype (``cache_dtype`` if unset)."""
        if self.mamba_ssm_dtype is None:
            return self.dtype
        return dtype_name(self.mamba_ssm_dtype, "mamba_ssm_dtype")

    def kind_counts(self) -> dict[str, int]:
        """Number of layers per kind name (``full``, ``sliding_window``...)."""
        return dict(Counter(k.kind for k in self.resolved_layers))

    def kv_cache_specs(self, block_size: int) -> dict[str, KVCacheSpec]:
        """``{layers.i: spec}`` for every layer with a cache, at ``block_size``.

        These are the raw specs before page-size unification (the planner
        changes block sizes and Mamba padding so that all pages match).
        """
        specs: dict[str, KVCacheSpec] = {}
        for i, kind in enumerate(self.resolved_layers):
            spec = kind.to_spec(block_size, self.dtype, self.ssm_dtype)
            if spec is not None:
                specs[layer_name(i)] = spec
        return specs

    def summary(self) -> str:
        """One line: name and layers per kind."""
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.kind_counts().items()))
        return f"{self.name}: {self.total_layers} layers ({counts})"
