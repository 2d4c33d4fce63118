"""The layouts shipped in ``configs/``: they load, and their shapes are the models'.

Per-model expectations restate the public config.json values (layer counts per
kind, which layers are global, KV bytes per token computed by hand) so that an
edit of a YAML file that changes a model's shape fails here.
"""

from __future__ import annotations

import pytest

from hybridkv.layouts import (
    FullAttentionLayer,
    Mamba1Layer,
    Mamba2Layer,
    ModelLayout,
    dump_layout,
    layout_from_dict,
    shipped_layout,
    shipped_names,
)
from hybridkv.layouts.yaml_io import load_layout
from hybridkv.specs import AttentionSpec, MambaSpec

SYNTHETIC = {
    "tiny-gemma3",
    "tiny-llama4",
    "tiny-jamba",
    "toy-1full-3sliding",
    "toy-10full-20sliding",
    "20full-30sliding",
}

# name -> (layers, {kind: count}, max_model_len)
EXPECTED = {
    "gemma-3-270m": (18, {"sliding_window": 15, "full": 3}, 32768),
    "gemma-3-1b": (26, {"sliding_window": 22, "full": 4}, 32768),
    "gemma-3-4b": (34, {"sliding_window": 29, "full": 5}, 131072),
    "gemma-3-12b": (48, {"sliding_window": 40, "full": 8}, 131072),
    "gemma-3-27b": (62, {"sliding_window": 52, "full": 10}, 131072),
    "llama-4-scout": (48, {"chunked_local": 36, "full": 12}, 10_485_760),
    "llama-4-maverick": (48, {"chunked_local": 36, "full": 12}, 1_048_576),
    "jamba-v0.1": (32, {"full": 4, "mamba1": 28}, 262144),
    "jamba-1.5-mini": (32, {"full": 4, "mamba1": 28}, 262144),
    "gpt-oss-20b": (24, {"sliding_window": 12, "full": 12}, 131072),
    "gpt-oss-120b": (36, {"sliding_window": 18, "full": 18}, 131072),
    "mistral-7b-v0.1": (32, {"sliding_window": 32}, 32768),
    "ministral-8b": (36, {"sliding_window": 36}, 32768),
    "command-r7b": (32, {"sliding_window": 24, "full": 8}, 8192),
    "bamba-9b": (32, {"full": 3, "mamba2": 29}, 262144),
    "granite-4.0-h-tiny": (40, {"full": 4, "mamba2": 36}, 131072),
    "tiny-gemma3": (4, {"sliding_window": 3, "full": 1}, 256),
    "tiny-llama4": (4, {"chunked_local": 3, "full": 1}, 256),
    "tiny-jamba": (4, {"mamba1": 2, "full": 2}, 256),
    "toy-1full-3sliding": (4, {"full": 1, "sliding_window": 3}, 1024),
    "toy-10full-20sliding": (30, {"full": 10, "sliding_window": 20}, 4096),
    "20full-30sliding": (50, {"full": 20, "sliding_window": 30}, 32768),
}


def full_layer_indices(layout: ModelLayout) -> list[int]:
    return [i for i, k in enumerate(layout.resolved_layers) if isinstance(k, FullAttentionLayer)]


def kv_bytes_per_token(layout: ModelLayout) -> int:
    """K and V bytes one token adds over all attention layers (block size 1)."""
    specs = layout.kv_cache_specs(block_size=1).values()
    return sum(s.page_size_bytes for s in specs if isinstance(s, AttentionSpec))


def test_every_model_of_the_brief_is_shipped() -> None:
    assert set(EXPECTED) <= set(shipped_names())
    assert set(shipped_names()) <= set(EXPECTED), "a new shipped layout needs an EXPECTED row"


@pytest.mark.parametrize("name", shipped_names())
def test_shipped_layout_loads_with_expected_shape(name: str) -> None:
    layout = shipped_layout(name)
    assert layout.name == name
    layers, counts, max_model_len = EXPECTED[name]
    assert layout.total_layers == layers
    assert layout.kind_counts() == counts
    assert layout.max_model_len == max_model_len
    assert layout.cache_dtype == "bfloat16"
    specs = layout.kv_cache_specs(block_size=16)
    assert len(specs) == layers  # every layer of these models has a cache


@pytest.mark.parametrize("name", shipped_names())
def test_shipped_layout_round_trips_through_yaml(name: str, tmp_path) -> None:
    layout = shipped_layout(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_layout(layout))
    again = load_layout(path)
    assert again.resolved_layers == layout.resolved_layers
    assert again == layout_from_dict(layout.model_dump(mode="json"))


@pytest.mark.parametrize("name", sorted(set(shipped_names()) - SYNTHETIC))
def test_real_layouts_cite_their_config_json(name: str) -> None:
    source = shipped_layout(name).source
    assert source is not None
    assert source.startswith("https://huggingface.co/")
    assert "/blob/main/config.json" in source


@pytest.mark.parametrize(
    "name", ["gemma-3-270m", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"]
)
def test_gemma3_every_sixth_layer_is_global(name: str) -> None:
    layout = shipped_layout(name)
    assert full_layer_indices(layout) == [i for i in range(layout.total_layers) if i % 6 == 5]


@pytest.mark.parametrize("name", ["llama-4-scout", "llama-4-maverick"])
def test_llama4_every_fourth_layer_is_nope_full(name: str) -> None:
    layout = shipped_layout(name)
    assert full_layer_indices(layout) == list(range(3, 48, 4))
    chunks = {k.attention_chunk_size for k in layout.resolved_layers if k.kind == "chunked_local"}
    assert chunks == {8192}


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("jamba-v0.1", [4, 12, 20, 28]),
        ("jamba-1.5-mini", [4, 12, 20, 28]),
        ("bamba-9b", [9, 18, 27]),
        ("granite-4.0-h-tiny", [5, 15, 25, 35]),
        ("gpt-oss-20b", list(range(1, 24, 2))),
        ("gpt-oss-120b", list(range(1, 36, 2))),
        ("command-r7b", list(range(3, 32, 4))),
        ("mistral-7b-v0.1", []),
        ("ministral-8b", []),
    ],
)
def test_global_layers_sit_where_the_config_puts_them(name: str, full: list[int]) -> None:
    assert full_layer_indices(shipped_layout(name)) == full


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # layers * 2 (K and V) * kv_heads * head_dim * 2 bytes (bf16)
        ("gemma-3-27b", 62 * 2 * 16 * 128 * 2),
        ("gemma-3-1b", 26 * 2 * 1 * 256 * 2),
        ("gemma-3-4b", 34 * 2 * 4 * 256 * 2),
        ("llama-4-scout", 48 * 2 * 8 * 128 * 2),
        ("gpt-oss-20b", 24 * 2 * 8 * 64 * 2),
        ("mistral-7b-v0.1", 32 * 2 * 8 * 128 * 2),
        ("command-r7b", 32 * 2 * 8 * 128 * 2),
        # hybrids: attention layers only
        ("jamba-v0.1", 4 * 2 * 8 * 128 * 2),
        ("bamba-9b", 3 * 2 * 8 * 128 * 2),
        ("granite-4.0-h-tiny", 4 * 2 * 4 * 128 * 2),
    ],
)
def test_kv_bytes_per_token_match_hand_computation(name: str, expected: int) -> None:
    assert kv_bytes_per_token(shipped_layout(name)) == expected


def test_jamba_mamba1_state_shapes() -> None:
    mamba = [k for k in shipped_layout("jamba-v0.1").resolved_layers if k.is_mamba]
    assert all(isinstance(k, Mamba1Layer) for k in mamba)
    # conv (d_conv - 1, d_inner), SSM (d_inner, d_state); d_inner = 2 * 4096
    assert mamba[0].state_shapes() == ((3, 8192), (8192, 16))


def test_bamba_mamba2_state_shapes_and_bytes() -> None:
    layout = shipped_layout("bamba-9b")
    mamba = [k for k in layout.resolved_layers if k.is_mamba]
    assert all(isinstance(k, Mamba2Layer) for k in mamba)
    # conv (3, 128 * 64 + 2 * 1 * 128), SSM (128 heads, 64, 128)
    assert mamba[0].state_shapes() == ((3, 8448), (128, 64, 128))
    spec = layout.kv_cache_specs(block_size=16)["layers.0"]
    assert isinstance(spec, MambaSpec)
    assert spec.state_size_bytes == (3 * 8448 + 128 * 64 * 128) * 2


def test_tiny_layouts_fit_the_tiny_hf_models_of_the_environment_notes() -> None:
    gemma = shipped_layout("tiny-gemma3").resolved_layers
    assert [k.kind for k in gemma] == ["sliding_window"] * 3 + ["full"]
    assert {(k.num_kv_heads, k.head_dim) for k in gemma} == {(2, 16)}
    assert gemma[0].sliding_window == 8
    jamba = shipped_layout("tiny-jamba").resolved_layers
    assert [k.kind for k in jamba] == ["mamba1", "full", "mamba1", "full"]
