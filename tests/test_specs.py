"""Specs and KVCacheConfig: page sizes, memory bounds, immutability, validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hybridkv
import hybridkv.specs
from hybridkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridkv.specs.dtypes import DTYPE_ALIASES, DTYPE_BYTES, dtype_name, to_torch_dtype


# -- page sizes ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "dtype_bytes"),
    [(torch.float32, 4), ("bfloat16", 2), ("fp16", 2), ("fp8", 1), (torch.int8, 1)],
)
def test_attention_page_size_is_k_plus_v(dtype: object, dtype_bytes: int) -> None:
    # 2 (K and V) * block_size 16 * 8 heads * head_size 128 * dtype_bytes
    spec = FullAttentionSpec(16, 8, 128, dtype)
    assert spec.dtype_bytes == dtype_bytes
    assert spec.page_size_bytes == 2 * 16 * 8 * 128 * dtype_bytes


def test_sliding_and_chunked_pages_match_full_attention() -> None:
    # The window / chunk does not change what one block stores.
    f = FullAttentionSpec(4, 2, 64, "bf16")
    s = SlidingWindowSpec(4, 2, 64, "bf16", sliding_window=7)
    c = ChunkedLocalAttentionSpec(4, 2, 64, "bf16", attention_chunk_size=8)
    assert f.page_size_bytes == s.page_size_bytes == c.page_size_bytes == 2 * 4 * 2 * 64 * 2
    assert (f.kind, s.kind, c.kind) == ("full", "sliding_window", "chunked_local")


def test_dtype_names_and_torch_dtypes_are_normalised_to_one_name() -> None:
    # A spec holds the canonical name; to_torch_dtype gives the torch.dtype back.
    assert FullAttentionSpec(4, 1, 8, "bf16").dtype == "bfloat16"
    assert to_torch_dtype(FullAttentionSpec(4, 1, 8, "bf16").dtype) is torch.bfloat16
    assert FullAttentionSpec(4, 1, 8, torch.float32).dtype == "float32"
    assert to_torch_dtype(FullAttentionSpec(4, 1, 8, "float32").dtype) is torch.float32
    assert FullAttentionSpec(4, 1, 8, "bf16") == FullAttentionSpec(4, 1, 8, torch.bfloat16)
    assert hash(FullAttentionSpec(4, 1, 8, "bf16")) == hash(
        FullAttentionSpec(4, 1, 8, torch.bfloat16)
    )
    mamba = MambaSpec(4, shapes=((2, 3), (3, 4)), dtypes=(torch.float32, "bf16"))
    assert mamba.dtypes == ("float32", "bfloat16")
    assert mamba == MambaSpec(4, shapes=((2, 3), (3, 4)), dtypes=("fp32", torch.bfloat16))


def test_the_size_table_matches_torch() -> None:
    # The specs size pages from DTYPE_BYTES without torch; torch must agree.
    for name, size in DTYPE_BYTES.items():
        assert to_torch_dtype(name).itemsize == size, name
        assert getattr(torch, name) is to_torch_dtype(name)
    for alias, name in DTYPE_ALIASES.items():
        assert dtype_name(alias) == name and dtype_name(alias.upper()) == name


@pytest.mark.parametrize("dtype", ["float64", "int4", torch.float64, torch.int32, 2])
def test_a_dtype_without_a_cache_size_is_refused(dtype: object) -> None:
    with pytest.raises(ValueError, match="dtype"):
        FullAttentionSpec(4, 1, 8, dtype)


def test_mamba_page_is_sum_of_states() -> None:
    # Mamba2-like: conv (3, 4) fp32 = 48 B, ssm (2, 4, 8) bf16 = 128 B -> 176 B.
    spec = MambaSpec(16, shapes=((3, 4), (2, 4, 8)), dtypes=(torch.float32, "bf16"))
    assert spec.state_size_bytes == 3 * 4 * 4 + 2 * 4 * 8 * 2 == 176
    assert spec.page_size_bytes == 176
    assert spec.kind == "mamba"
    # Mamba1 is accepted as well; same formula.
    m1 = MambaSpec(16, shapes=[[5, 2], [5, 3]], dtypes=["fp16", "fp16"], mamba_type="mamba1")
    assert m1.shapes == ((5, 2), (5, 3))
    assert m1.page_size_bytes == (10 + 15) * 2


def test_mamba_padded_page() -> None:
    spec = MambaSpec(16, shapes=((3, 4), (2, 4)), dtypes=("fp32", "fp32"), page_size_padded=128)
    assert spec.state_size_bytes == 80
    assert spec.page_size_bytes == 128
    # Padding to exactly the state size is allowed.
    exact = MambaSpec(16, shapes=((3, 4), (2, 4)), dtypes=("fp32", "fp32"), page_size_padded=80)
    assert exact.page_size_bytes == 80


# -- max_memory_usage_bytes ------------------------------------------------------------
def test_full_attention_max_memory_is_whole_model_len() -> None:
    spec = FullAttentionSpec(4, 1, 8, "fp16")  # page = 2*4*1*8*2 = 128
    assert spec.max_memory_usage_bytes(10, 2) == 3 * 128  # ceil(10 / 4) blocks
    assert spec.max_memory_usage_bytes(12, 1000) == 3 * 128  # batch size irrelevant


def test_sliding_window_max_memory() -> None:
    spec = SlidingWindowSpec(4, 1, 8, "fp16", sliding_window=8)  # page 128
    # A step of 16 tokens reads the W-1 = 7 before it: 23 tokens -> 6 blocks,
    # +1 because the first of them may sit anywhere in a block.
    assert spec.max_memory_usage_bytes(1000, 16) == 7 * 128
    # Never more than the full model length: 20 tokens -> 5 blocks.
    assert spec.max_memory_usage_bytes(20, 16) == 5 * 128


def test_chunked_max_memory() -> None:
    spec = ChunkedLocalAttentionSpec(4, 1, 8, "fp16", attention_chunk_size=8)
    # chunk 8 + step 16 = 24 tokens -> 6 blocks, +1 for alignment.
    assert spec.max_memory_usage_bytes(1000, 16) == 7 * 128
    assert spec.max_memory_usage_bytes(10, 16) == 3 * 128  # capped at ceil(10 / 4)


def test_mamba_max_memory() -> None:
    spec = MambaSpec(4, shapes=((3, 4), (2, 4)), dtypes=("fp32", "fp32"))  # page 80
    # A 10-token step crosses ceil(10 / 4) = 3 checkpoints, plus the state it starts from.
    assert spec.max_memory_usage_bytes(1000, 10) == 4 * 80
    assert spec.max_memory_usage_bytes(4, 10) == 2 * 80  # the step is capped at 4 tokens


@pytest.mark.parametrize("field", ["max_model_len", "max_num_batched_tokens"])
def test_max_memory_rejects_non_positive_lengths(field: str) -> None:
    args = {"max_model_len": 16, "max_num_batched_tokens": 16, field: 0}
    with pytest.raises(ValueError, match=field):
        FullAttentionSpec(4, 1, 8, "fp16").max_memory_usage_bytes(**args)


# -- frozen ----------------------------------------------------------------------
def test_specs_are_frozen_and_hashable() -> None:
    spec = SlidingWindowSpec(4, 1, 8, "fp16", sliding_window=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.sliding_window = 16  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.block_size = 8  # type: ignore[misc]
    mamba = MambaSpec(4, shapes=((2, 2),), dtypes=("fp32",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        mamba.page_size_padded = 64  # type: ignore[misc]
    # Equal specs are interchangeable (a group is "layers with equal specs").
    assert {spec, SlidingWindowSpec(4, 1, 8, torch.float16, sliding_window=8)} == {spec}


def test_exported_from_both_packages() -> None:
    for name in hybridkv.specs.__all__:
        assert getattr(hybridkv, name) is getattr(hybridkv.specs, name)


# -- spec validation ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: FullAttentionSpec(0, 1, 8, "fp16"), "block_size"),
        (lambda: FullAttentionSpec(-4, 1, 8, "fp16"), "block_size"),
        (lambda: FullAttentionSpec(True, 1, 8, "fp16"), "block_size"),
        (lambda: FullAttentionSpec(4.0, 1, 8, "fp16"), "block_size"),
        (lambda: FullAttentionSpec(4, 0, 8, "fp16"), "num_kv_heads"),
        (lambda: FullAttentionSpec(4, 1, -8, "fp16"), "head_size"),
        (lambda: FullAttentionSpec(4, 1, 8, "float13"), "dtype"),
        (lambda: FullAttentionSpec(4, 1, 8, 2), "dtype"),
        (lambda: SlidingWindowSpec(4, 1, 8, "fp16", sliding_window=0), "sliding_window"),
        (lambda: SlidingWindowSpec(4, 1, 8, "fp16", sliding_window=-1), "sliding_window"),
        (
            lambda: ChunkedLocalAttentionSpec(4, 1, 8, "fp16", attention_chunk_size=0),
            "attention_chunk_size",
        ),
        (lambda: MambaSpec(0, shapes=((2,),), dtypes=("fp32",)), "block_size"),
        (lambda: MambaSpec(4, shapes=(), dtypes=()), "shapes"),
        (lambda: MambaSpec(4, shapes=((2, 0),), dtypes=("fp32",)), "shapes"),
        (lambda: MambaSpec(4, shapes=((2, 2),), dtypes=("fp32", "fp32")), "dtypes"),
        (lambda: MambaSpec(4, shapes=((2, 2), (3,)), dtypes=("fp32",)), "dtypes"),
        (lambda: MambaSpec(4, shapes=((2, 2),), dtypes="fp32"), "dtypes"),
        (lambda: MambaSpec(4, shapes=((2, 2),), dtypes=("nope",)), "dtypes"),
        (lambda: MambaSpec(4, shapes=((2, 2),), dtypes=("fp32",), mamba_type="s4"), "mamba_type"),
        (
            # state is 2*2*4 = 16 bytes; a 15-byte page cannot hold it
            lambda: MambaSpec(4, shapes=((2, 2),), dtypes=("fp32",), page_size_padded=15),
            "page_size_padded",
        ),
        (
            lambda: MambaSpec(4, shapes=((2, 2),), dtypes=("fp32",), page_size_padded=0),
            "page_size_padded",
        ),
    ],
)
def test_invalid_spec_names_the_field(make: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()  # type: ignore[operator]


# -- KVCacheConfig ----------------------------------------------------------------------
def _full() -> FullAttentionSpec:
    return FullAttentionSpec(4, 1, 8, "fp16")  # page 128


def _swa() -> SlidingWindowSpec:
    return SlidingWindowSpec(2, 1, 8, "fp16", sliding_window=4)  # page 64


def test_config_with_tensors_is_valid_when_each_tensor_fits() -> None:
    # One tensor per "layer pair" (one layer of each group): 10 pages of the
    # biggest page (128) = 1280 bytes.
    groups = [KVCacheGroupSpec(["a0", "a1"], _full()), KVCacheGroupSpec(["s0", "s1"], _swa())]
    tensors = [KVCacheTensor(1280, ["a0", "s0"]), KVCacheTensor(1280, ["a1", "s1"])]
    cfg = KVCacheConfig(num_blocks=10, kv_cache_tensors=tensors, kv_cache_groups=groups)
    assert cfg.num_blocks == 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_blocks = 11  # type: ignore[misc]


def test_config_tensor_too_small() -> None:
    groups = [KVCacheGroupSpec(["a0"], _full())]
    with pytest.raises(ValueError, match=r"too small for layer 'a0'.*slots of 127 bytes.*128"):
        KVCacheConfig(10, [KVCacheTensor(1279, ["a0"])], groups)


def test_config_packs_layers_of_one_group_in_a_slot() -> None:
    # Two layers of one group in one tensor need two pages per slot; layers of
    # different groups overlap (they never share a block id).
    groups = [KVCacheGroupSpec(["a0", "a1"], _full()), KVCacheGroupSpec(["s0"], _swa())]
    KVCacheConfig(10, [KVCacheTensor(2560, ["a0", "a1", "s0"])], groups)
    with pytest.raises(ValueError, match=r"too small for layer 'a1'.*256 bytes per block"):
        KVCacheConfig(10, [KVCacheTensor(2559, ["a0", "a1", "s0"])], groups)


@pytest.mark.parametrize("num_blocks", [0, 1])
def test_config_needs_two_blocks(num_blocks: int) -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheConfig(num_blocks, [], [KVCacheGroupSpec(["a"], _full())])
    KVCacheConfig(2, [], [KVCacheGroupSpec(["a"], _full())])  # the null block + one


def test_config_rejects_duplicate_layers() -> None:
    with pytest.raises(ValueError, match=r"'a'.*more than one group"):
        KVCacheConfig(4, [], [KVCacheGroupSpec(["a"], _full()), KVCacheGroupSpec(["a"], _swa())])
    with pytest.raises(ValueError, match="layer_names"):
        KVCacheGroupSpec(["a", "a"], _full())
    with pytest.raises(ValueError, match="layer_names"):
        KVCacheGroupSpec([], _full())


def test_config_rejects_layer_without_tensor() -> None:
    groups = [KVCacheGroupSpec(["a"], _full()), KVCacheGroupSpec(["s"], _swa())]
    with pytest.raises(ValueError, match=r"without a KVCacheTensor.*'s'"):
        KVCacheConfig(4, [KVCacheTensor(4 * 128, ["a"])], groups)


def test_config_rejects_unknown_layer_in_shared_by() -> None:
    groups = [KVCacheGroupSpec(["a"], _full())]
    with pytest.raises(ValueError, match=r"shared_by.*unknown layer 'ghost'"):
        KVCacheConfig(4, [KVCacheTensor(4 * 128, ["a", "ghost"])], groups)


def test_config_rejects_layer_in_two_tensors() -> None:
    groups = [KVCacheGroupSpec(["a"], _full())]
    with pytest.raises(ValueError, match=r"'a'.*more than one KVCacheTensor"):
        KVCacheConfig(4, [KVCacheTensor(512, ["a"]), KVCacheTensor(512, ["a"])], groups)


def test_config_and_tensor_field_checks() -> None:
    with pytest.raises(ValueError, match="kv_cache_groups"):
        KVCacheConfig(4, [], [])
    with pytest.raises(ValueError, match=r"KVCacheTensor\.size"):
        KVCacheTensor(0, ["a"])
    with pytest.raises(ValueError, match="shared_by"):
        KVCacheTensor(128, [])
    with pytest.raises(ValueError, match="kv_cache_spec"):
        KVCacheGroupSpec(["a"], "full")  # type: ignore[arg-type]
