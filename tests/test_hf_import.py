"""Importing layouts from Hugging Face configs, and YAML error messages.

Each real model's transformers config class is built with the model's public
dimensions (cheap and offline), saved with ``save_pretrained`` and imported:
the layers must equal the shipped YAML's. This cross-checks the YAML files
against transformers' own ``layer_types`` logic. Tiny configs (the kwargs of
shared/ENVIRONMENT.md) cover each family at test scale.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hf_configs import TINY_JAMBA_LAYERS
from transformers import (
    AutoConfig,
    BambaConfig,
    Cohere2Config,
    Gemma3Config,
    Gemma3TextConfig,
    GptOssConfig,
    GraniteMoeHybridConfig,
    JambaConfig,
    Llama4Config,
    Llama4TextConfig,
    LlamaConfig,
    MinistralConfig,
    MistralConfig,
)

from hybridkv.layouts import (
    SUPPORTED_MODEL_TYPES,
    LayoutError,
    Mamba2Layer,
    dump_layout,
    layout_from_hf_config,
    load_layout,
    shipped_layout,
)
from hybridkv.layouts.hf_families import READERS

# --- the real models, at their public config.json dimensions -----------------


def gemma3_text(layers: int, hidden: int, heads: int, kv: int, hd: int, window: int, ctx: int):
    return dict(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        sliding_window=window,
        max_position_embeddings=ctx,
    )


def llama4(experts: int, step: int, ctx: int) -> Llama4Config:
    return Llama4Config(
        text_config=dict(
            num_hidden_layers=48,
            hidden_size=5120,
            num_attention_heads=40,
            num_key_value_heads=8,
            head_dim=128,
            attention_chunk_size=8192,
            max_position_embeddings=ctx,
            num_local_experts=experts,
            interleave_moe_layer_step=step,
        )
    )


def jamba_v01() -> JambaConfig:
    return JambaConfig(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        attn_layer_period=8,
        attn_layer_offset=4,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        num_experts=16,
        max_position_embeddings=262144,
    )


def gpt_oss(layers: int, experts: int) -> GptOssConfig:
    return GptOssConfig(
        num_hidden_layers=layers,
        hidden_size=2880,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        sliding_window=128,
        num_local_experts=experts,
        max_position_embeddings=131072,
    )


GRANITE_H_TINY_TYPES = (
    ["mamba"] * 5 + ["attention"] + (["mamba"] * 9 + ["attention"]) * 3 + ["mamba"] * 4
)

REAL: dict[str, Callable[[], Any]] = {
    "gemma-3-270m": lambda: Gemma3TextConfig(**gemma3_text(18, 640, 4, 1, 256, 512, 32768)),
    "gemma-3-1b": lambda: Gemma3TextConfig(**gemma3_text(26, 1152, 4, 1, 256, 512, 32768)),
    "gemma-3-4b": lambda: Gemma3Config(text_config=gemma3_text(34, 2560, 8, 4, 256, 1024, 131072)),
    "gemma-3-12b": lambda: Gemma3Config(
        text_config=gemma3_text(48, 3840, 16, 8, 256, 1024, 131072)
    ),
    "gemma-3-27b": lambda: Gemma3Config(
        text_config=gemma3_text(62, 5376, 32, 16, 128, 1024, 131072)
    ),
    "llama-4-scout": lambda: llama4(16, 1, 10_485_760),
    "llama-4-maverick": lambda: llama4(128, 2, 1_048_576),
    "jamba-v0.1": jamba_v01,
    "jamba-1.5-mini": jamba_v01,
    "gpt-oss-20b": lambda: gpt_oss(24, 32),
    "gpt-oss-120b": lambda: gpt_oss(36, 128),
    "mistral-7b-v0.1": lambda: MistralConfig(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        sliding_window=4096,
        max_position_embeddings=32768,
    ),
    "ministral-8b": lambda: MistralConfig(
        num_hidden_layers=36,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        sliding_window=32768,
        max_position_embeddings=32768,
    ),
    "command-r7b": lambda: Cohere2Config(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        sliding_window=4096,
        max_position_embeddings=8192,
    ),
    "bamba-9b": lambda: BambaConfig(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        attn_layer_indices=[9, 18, 27],
        mamba_n_heads=128,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_d_conv=4,
        mamba_expand=2,
    ),
    "granite-4.0-h-tiny": lambda: GraniteMoeHybridConfig(
        num_hidden_layers=40,
        hidden_size=1536,
        num_attention_heads=12,
        num_key_value_heads=4,
        layer_types=GRANITE_H_TINY_TYPES,
        mamba_n_heads=48,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_d_conv=4,
        mamba_expand=2,
        num_local_experts=64,
        num_experts_per_tok=6,
        max_position_embeddings=131072,
    ),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_import_of_saved_real_config_equals_shipped_yaml(name: str, tmp_path: Path) -> None:
    model_dir = tmp_path / name
    REAL[name]().save_pretrained(model_dir)
    imported = layout_from_hf_config(model_dir)
    shipped = shipped_layout(name)
    assert imported.resolved_layers == shipped.resolved_layers
    assert imported.max_model_len == shipped.max_model_len
    assert imported.name == name  # the directory name
    assert imported.source == str(model_dir / "config.json")


@pytest.mark.parametrize("name", ["gemma-3-27b", "llama-4-scout", "bamba-9b", "gpt-oss-20b"])
def test_import_of_config_object_equals_shipped_yaml(name: str) -> None:
    imported = layout_from_hf_config(REAL[name]())
    assert imported.resolved_layers == shipped_layout(name).resolved_layers


def test_multimodal_wrappers_use_their_text_config(tmp_path: Path) -> None:
    REAL["gemma-3-4b"]().save_pretrained(tmp_path / "g")
    REAL["llama-4-maverick"]().save_pretrained(tmp_path / "l")
    assert json.loads((tmp_path / "g" / "config.json").read_text())["model_type"] == "gemma3"
    assert json.loads((tmp_path / "l" / "config.json").read_text())["model_type"] == "llama4"
    gemma = layout_from_hf_config(tmp_path / "g")
    llama = layout_from_hf_config(tmp_path / "l")
    assert gemma.kind_counts() == {"sliding_window": 29, "full": 5}
    assert llama.kind_counts() == {"chunked_local": 36, "full": 12}
    assert llama.max_model_len == 1_048_576


def test_a_config_json_path_is_accepted(tmp_path: Path) -> None:
    REAL["command-r7b"]().save_pretrained(tmp_path / "r7b")
    layout = layout_from_hf_config(tmp_path / "r7b" / "config.json", name="cr7b")
    assert layout.name == "cr7b"
    assert layout.resolved_layers == shipped_layout("command-r7b").resolved_layers


def test_the_result_is_compact_and_dumps_to_a_loadable_yaml(tmp_path: Path) -> None:
    REAL["gemma-3-27b"]().save_pretrained(tmp_path / "g")
    gemma = layout_from_hf_config(tmp_path / "g")
    assert gemma.pattern is not None and len(gemma.pattern) == 6
    assert gemma.num_layers == 62
    assert sorted(gemma.layer_kinds) == ["full", "sliding"]
    bamba = layout_from_hf_config(REAL["bamba-9b"]())
    assert bamba.layers is not None and len(bamba.layers) == 32  # not periodic
    path = tmp_path / "gemma.yaml"
    path.write_text(dump_layout(gemma))
    assert load_layout(path).resolved_layers == gemma.resolved_layers


# --- defaults and overrides ------------------------------------------------------


def test_cache_dtype_comes_from_the_config_when_it_is_a_float(tmp_path: Path) -> None:
    config = Gemma3TextConfig(**gemma3_text(2, 64, 4, 2, 16, 8, 256))
    assert layout_from_hf_config(config).cache_dtype == "bfloat16"  # no dtype: default
    config.dtype = "float16"
    config.save_pretrained(tmp_path)
    assert layout_from_hf_config(tmp_path).cache_dtype == "float16"
    overridden = layout_from_hf_config(tmp_path, cache_dtype="float32", max_model_len=64)
    assert (overridden.cache_dtype, overridden.max_model_len) == ("float32", 64)


def test_name_defaults_to_model_type_for_a_bare_config_object() -> None:
    layout = layout_from_hf_config(Cohere2Config(num_hidden_layers=4, max_position_embeddings=64))
    assert layout.name == "cohere2"
    assert layout.source is None


# --- errors ----------------------------------------------------------------------


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(LayoutError, match=r"no-such-model: no such directory or file"):
        layout_from_hf_config(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayoutError, match=r"empty/config\.json: no such file"):
        layout_from_hf_config(tmp_path / "empty")


def test_unsupported_model_type_lists_the_supported_ones(tmp_path: Path) -> None:
    LlamaConfig(num_hidden_layers=2).save_pretrained(tmp_path)
    with pytest.raises(LayoutError, match="model_type 'llama' is not supported") as err:
        layout_from_hf_config(tmp_path)
    for model_type in SUPPORTED_MODEL_TYPES:
        assert model_type in str(err.value)
    with pytest.raises(LayoutError, match="not supported"):
        layout_from_hf_config(LlamaConfig(num_hidden_layers=2))


def test_invalid_json_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(LayoutError, match="not a readable JSON config"):
        layout_from_hf_config(tmp_path)


def test_an_object_that_is_not_a_config_is_rejected() -> None:
    with pytest.raises(LayoutError, match="got int"):
        layout_from_hf_config(3)


def test_bidirectional_gemma_embedding_models_are_rejected() -> None:
    config = Gemma3TextConfig(
        **gemma3_text(2, 64, 4, 2, 16, 8, 256), use_bidirectional_attention=True
    )
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        layout_from_hf_config(config)


def test_unknown_layer_type_names_the_index() -> None:
    config = SimpleNamespace(
        model_type="gpt_oss",
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "mystery"],
        max_position_embeddings=64,
    )
    with pytest.raises(ValueError, match=r"layer_types\[1\] is 'mystery'"):
        layout_from_hf_config(config)


# --- tiny configs from shared/ENVIRONMENT.md, one per family -------------------

COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
MAMBA2 = dict(
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=1,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=16,
)


def test_tiny_gemma3_matches_the_shipped_tiny_layout(tmp_path: Path) -> None:
    Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    ).save_pretrained(tmp_path)
    layout = layout_from_hf_config(tmp_path)
    assert layout.resolved_layers == shipped_layout("tiny-gemma3").resolved_layers
    assert layout.max_model_len == 256


def test_tiny_llama4_matches_the_shipped_tiny_layout(tmp_path: Path) -> None:
    Llama4TextConfig(
        **COMMON,
        head_dim=16,
        num_hidden_layers=4,
        intermediate_size_mlp=128,
        attention_chunk_size=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        no_rope_layers=[1, 1, 1, 0],
    ).save_pretrained(tmp_path)
    layout = layout_from_hf_config(tmp_path)
    assert layout.resolved_layers == shipped_layout("tiny-llama4").resolved_layers


def test_tiny_jamba_matches_the_shipped_tiny_layout(tmp_path: Path) -> None:
    JambaConfig(
        **COMMON,
        num_hidden_layers=4,
        **TINY_JAMBA_LAYERS,
    ).save_pretrained(tmp_path)
    layout = layout_from_hf_config(tmp_path)
    assert layout.resolved_layers == shipped_layout("tiny-jamba").resolved_layers


@pytest.mark.parametrize(
    ("make", "kinds"),
    [
        (
            lambda: BambaConfig(**COMMON, **MAMBA2, num_hidden_layers=4, attn_layer_indices=[1]),
            ["mamba2", "full", "mamba2", "mamba2"],
        ),
        (
            lambda: GraniteMoeHybridConfig(
                **COMMON,
                **MAMBA2,
                num_hidden_layers=4,
                layer_types=["mamba", "attention", "mamba", "attention"],
            ),
            ["mamba2", "full", "mamba2", "full"],
        ),
    ],
    ids=["bamba", "granitemoehybrid"],
)
def test_tiny_mamba2_hybrids(make: Callable[[], Any], kinds: list[str], tmp_path: Path) -> None:
    make().save_pretrained(tmp_path)
    layout = layout_from_hf_config(tmp_path)
    assert [k.kind for k in layout.resolved_layers] == kinds
    mamba = layout.resolved_layers[0]
    assert isinstance(mamba, Mamba2Layer)
    assert (mamba.n_heads, mamba.head_dim, mamba.n_groups, mamba.d_state, mamba.d_conv) == (
        8,
        16,
        1,
        16,
        4,
    )
    full = layout.resolved_layers[1]
    assert (full.num_kv_heads, full.head_dim) == (2, 16)


@pytest.mark.parametrize(
    ("make", "kinds"),
    [
        (
            lambda: GptOssConfig(**COMMON, head_dim=16, num_hidden_layers=4, sliding_window=8),
            ["sliding_window", "full"] * 2,
        ),
        (
            lambda: Cohere2Config(**COMMON, num_hidden_layers=8, sliding_window=8),
            (["sliding_window"] * 3 + ["full"]) * 2,
        ),
        (
            lambda: MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=None),
            ["full", "full"],
        ),
        (
            lambda: MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=8),
            ["sliding_window", "sliding_window"],
        ),
        (
            lambda: MinistralConfig(
                **COMMON,
                num_hidden_layers=4,
                sliding_window=8,
                layer_types=["full_attention"] + ["sliding_attention"] * 3,
            ),
            ["full"] + ["sliding_window"] * 3,
        ),
    ],
    ids=["gpt_oss", "cohere2", "mistral-full", "mistral-sliding", "ministral"],
)
def test_tiny_attention_families(make: Callable[[], Any], kinds: list[str], tmp_path: Path) -> None:
    make().save_pretrained(tmp_path)
    layout = layout_from_hf_config(tmp_path)
    assert [k.kind for k in layout.resolved_layers] == kinds
    assert {(k.num_kv_heads, k.head_dim) for k in layout.resolved_layers} == {(2, 16)}
    windows = {k.sliding_window for k in layout.resolved_layers if k.kind == "sliding_window"}
    assert windows <= {8}


def test_saved_tiny_configs_reload_with_autoconfig(tmp_path: Path) -> None:
    # Guards the premise of the tests above: save_pretrained output is what AutoConfig reads.
    GptOssConfig(**COMMON, head_dim=16, num_hidden_layers=2).save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path, local_files_only=True).model_type == "gpt_oss"


# --- configs without layer_types (as older transformers versions wrote them) ---


@pytest.mark.parametrize(
    "name",
    [
        "gemma-3-1b",
        "gemma-3-27b",
        "llama-4-scout",
        "jamba-v0.1",
        "gpt-oss-20b",
        "command-r7b",
        "bamba-9b",
        "mistral-7b-v0.1",
    ],
)
def test_readers_fall_back_when_layer_types_is_absent(name: str) -> None:
    config = REAL[name]()
    text = getattr(config, "text_config", config)
    fields = {k: v for k, v in text.to_dict().items() if k not in ("layer_types",)}
    old = SimpleNamespace(**fields)  # no layer_types and no derived properties
    assert not hasattr(old, "layer_types")
    kinds = READERS[text.model_type](old)
    assert tuple(kinds) == shipped_layout(name).resolved_layers


def test_granite_reads_layers_block_type_when_layer_types_is_absent() -> None:
    fields = REAL["granite-4.0-h-tiny"]().to_dict()
    fields["layers_block_type"] = fields.pop("layer_types")
    kinds = READERS["granitemoehybrid"](SimpleNamespace(**fields))
    assert tuple(kinds) == shipped_layout("granite-4.0-h-tiny").resolved_layers
    fields.pop("layers_block_type")
    with pytest.raises(ValueError, match="neither 'layer_types' nor 'layers_block_type'"):
        READERS["granitemoehybrid"](SimpleNamespace(**fields))


# --- YAML error messages -----------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


HEADER = "name: bad\nmax_model_len: 64\n"
FULL = "{kind: full, num_kv_heads: 1, head_dim: 8}"


def test_yaml_error_names_file_field_and_expectation(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEADER
        + f"layers:\n  - {FULL}\n  - {FULL}\n"
        + "  - {kind: sliding_window, num_kv_heads: 1, head_dim: 8, sliding_window: 0}\n",
    )
    with pytest.raises(LayoutError) as err:
        load_layout(path)
    message = str(err.value)
    assert str(path) in message
    assert "layers[2].sliding_window: Input should be greater than 0 (got 0)" in message


def test_yaml_error_in_a_named_kind_names_its_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEADER + "layer_kinds:\n  w: {kind: sliding_window, num_kv_heads: 1, head_dim: 8}\n"
        "pattern: [w]\nnum_layers: 2\n",
    )
    with pytest.raises(LayoutError, match=r"layer_kinds\.w\.sliding_window: Field required"):
        load_layout(path)


def test_yaml_unknown_kind_name_in_pattern(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + f"layer_kinds:\n  a: {FULL}\npattern: [a, b]\nnum_layers: 4\n")
    expected = r"pattern\[1\]: unknown layer kind 'b'.*defined: \['a'\]"
    with pytest.raises(LayoutError, match=expected):
        load_layout(path)


def test_yaml_with_neither_layers_nor_pattern(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + f"layer_kinds:\n  a: {FULL}\n")
    with pytest.raises(LayoutError, match=r"give exactly one of 'layers'.*or 'pattern'"):
        load_layout(path)


def test_yaml_with_a_bad_dtype(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + f"cache_dtype: bfloat17\nlayers: [{FULL}]\n")
    with pytest.raises(LayoutError, match=r"cache_dtype='bfloat17' is not a known dtype.*bfloat16"):
        load_layout(path)


def test_yaml_with_an_unknown_kind_tag(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + "layers: [{kind: fullish, num_kv_heads: 1, head_dim: 8}]\n")
    with pytest.raises(LayoutError, match=r"layers\[0\]: Input tag 'fullish'.*'sliding_window'"):
        load_layout(path)
