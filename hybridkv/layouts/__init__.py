"""Model layouts: per-layer KV shapes of real models, from YAML or HF configs."""

from hybridkv.layouts.hf_families import SUPPORTED_MODEL_TYPES
from hybridkv.layouts.hf_import import layout_from_hf_config
from hybridkv.layouts.kinds import (
    KIND_NAMES,
    ChunkedLocalLayer,
    FullAttentionLayer,
    LayerKind,
    Mamba1Layer,
    Mamba2Layer,
    NoCacheLayer,
    SlidingWindowLayer,
)
from hybridkv.layouts.layout import ModelLayout, layer_name
from hybridkv.layouts.shipped import configs_dir, shipped_layout, shipped_names
from hybridkv.layouts.yaml_io import LayoutError, dump_layout, layout_from_dict, load_layout

__all__ = [
    "KIND_NAMES",
    "SUPPORTED_MODEL_TYPES",
    "ChunkedLocalLayer",
    "FullAttentionLayer",
    "LayerKind",
    "LayoutError",
    "Mamba1Layer",
    "Mamba2Layer",
    "ModelLayout",
    "NoCacheLayer",
    "SlidingWindowLayer",
    "configs_dir",
    "dump_layout",
    "layer_name",
    "layout_from_dict",
    "layout_from_hf_config",
    "load_layout",
    "shipped_layout",
    "shipped_names",
]
