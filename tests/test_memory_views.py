"""Shared-buffer views: each layer's block b owns exactly its bytes of its buffer.

Writing through one layer's view at block ``b`` must change only the bytes
``layer_byte_range`` names, and layers sharing a buffer must never overlap for
distinct block ids (or, within one group, ever).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from hybridkv.layouts import shipped_layout
from hybridkv.planning import (
    AttentionCache,
    KVCacheBuffers,
    MambaCache,
    allocate_kv_cache,
    layer_byte_range,
    plan_kv_cache,
)
from hybridkv.specs import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

CASES = [
    ("tiny-gemma3", "vllm"),
    ("tiny-jamba", "vllm"),
    ("tiny-jamba", "packed"),
    ("toy-10full-20sliding", "vllm"),
    ("tiny-llama4", "vllm"),
]


def _plan(name: str, unification: str, memory: int = 2_000_000) -> KVCacheConfig:
    layout = shipped_layout(name)
    return plan_kv_cache(
        layout, memory, unification=unification, max_model_len=64, max_num_batched_tokens=32
    ).kv_cache_config


def _write(cache: AttentionCache | MambaCache, block: int, value: int) -> None:
    views = (
        (cache.key, cache.value) if isinstance(cache, AttentionCache) else (cache.conv, cache.ssm)
    )
    for v in views:
        v[block].fill_(value)


def _changed(bufs: KVCacheBuffers) -> list[tuple[int, int, int]]:
    """(tensor, first, last+1) of the non-zero bytes of every buffer."""
    out = []
    for i, b in enumerate(bufs.buffers):
        nz = torch.nonzero(b).flatten()
        if nz.numel():
            out.append((i, int(nz[0]), int(nz[-1]) + 1))
    return out


@pytest.mark.parametrize(("name", "unification"), CASES)
def test_write_touches_only_its_block(name: str, unification: str) -> None:
    cfg = _plan(name, unification)
    bufs = allocate_kv_cache(cfg)
    assert [b.numel() for b in bufs.buffers] == [t.size for t in cfg.kv_cache_tensors]
    n = cfg.num_blocks
    for layer, cache in bufs.layers.items():
        for block in sorted({0, 1, n // 2, n - 1}):
            for b in bufs.buffers:
                b.zero_()
            _write(cache, block, 1)
            t, start, end = layer_byte_range(cfg, layer, block)
            changed = _changed(bufs)
            assert len(changed) == 1, (layer, block, changed)
            ct, first, last = changed[0]
            assert ct == t and start <= first and last <= end, (layer, block, changed)
            if isinstance(cache, AttentionCache):
                # K and V together fill the whole page.
                assert int(bufs.buffers[t][start:end].count_nonzero()) == end - start


@pytest.mark.parametrize(("name", "unification"), CASES)
def test_layers_sharing_a_buffer_never_overlap(name: str, unification: str) -> None:
    cfg = _plan(name, unification)
    group_of = {n: gi for gi, g in enumerate(cfg.kv_cache_groups) for n in g.layer_names}
    n = min(cfg.num_blocks, 6)
    for t in cfg.kv_cache_tensors:
        for a, b in itertools.combinations(t.shared_by, 2):
            for ba, bb in itertools.product(range(n), range(n)):
                if group_of[a] != group_of[b] and ba == bb:
                    continue  # different groups never hold the same block id
                _, s1, e1 = layer_byte_range(cfg, a, ba)
                _, s2, e2 = layer_byte_range(cfg, b, bb)
                assert e1 <= s2 or e2 <= s1, (a, ba, b, bb)


def test_views_round_trip_distinct_values() -> None:
    # Every (layer, block) written with its own value reads back intact.
    cfg = _plan("tiny-jamba", "packed")
    bufs = allocate_kv_cache(cfg)
    group_of = {n: gi for gi, g in enumerate(cfg.kv_cache_groups) for n in g.layer_names}
    # Give each group its own block ids, as the block pool does.
    blocks = {
        gi: [1 + gi + len(cfg.kv_cache_groups) * k for k in range(2)]
        for gi in set(group_of.values())
    }
    expected = {}
    for i, (layer, cache) in enumerate(bufs.layers.items()):
        for j, block in enumerate(blocks[group_of[layer]]):
            _write(cache, block, 1 + (i * 3 + j) % 100)
            expected[layer, block] = 1 + (i * 3 + j) % 100
    for (layer, block), value in expected.items():
        cache = bufs.layers[layer]
        views = (
            (cache.key, cache.value)
            if isinstance(cache, AttentionCache)
            else (cache.conv, cache.ssm)
        )
        for v in views:
            assert torch.all(v[block] == value), (layer, block)


def test_view_shapes_and_strides() -> None:
    cfg = _plan("tiny-jamba", "vllm")
    bufs = allocate_kv_cache(cfg)
    slot = cfg.kv_cache_tensors[0].size // cfg.num_blocks
    attn = bufs.layers["layers.1"]
    assert isinstance(attn, AttentionCache)
    bs = cfg.kv_cache_groups[
        [g.layer_names for g in cfg.kv_cache_groups].index(
            next(g.layer_names for g in cfg.kv_cache_groups if "layers.1" in g.layer_names)
        )
    ].kv_cache_spec.block_size
    assert attn.key.shape == (cfg.num_blocks, bs, 2, 16)
    assert attn.key.dtype == torch.bfloat16
    assert attn.key.stride(0) * 2 == slot
    mamba = bufs.layers["layers.0"]
    assert isinstance(mamba, MambaCache)
    assert mamba.conv.shape == (cfg.num_blocks, 3, 128)
    assert mamba.ssm.shape == (cfg.num_blocks, 128, 8)
    assert mamba.ssm.stride(0) * 2 == slot


def test_allocate_needs_tensors() -> None:
    cfg = _plan("tiny-gemma3", "vllm")
    empty = KVCacheConfig(cfg.num_blocks, [], cfg.kv_cache_groups)
    with pytest.raises(ValueError, match="describes no tensors"):
        allocate_kv_cache(empty)
    with pytest.raises(ValueError, match="element size"):
        allocate_kv_cache(cfg, dtype=torch.float32)
    viewed = allocate_kv_cache(cfg, dtype=torch.int16)
    cache = viewed.layers["layers.0"]
    assert isinstance(cache, AttentionCache) and cache.key.dtype == torch.int16


def test_a_mamba_state_that_fills_its_page_exactly_gets_views() -> None:
    # Conv (2, 32) + SSM (2, 32) in float32: 256 + 256 = 512 B, exactly the page of
    # a 16-token fp16 attention block with one KV head of 8 (2 x 16 x 8 x 2 B): no
    # padding, and the SSM state ends on the page's last byte.
    from hybridkv import FullAttentionSpec, MambaSpec

    attn = FullAttentionSpec(16, 1, 8, "float16")
    state = MambaSpec(16, shapes=((2, 32), (2, 32)), dtypes=("float32", "float32"))
    plan = plan_kv_cache(
        {"f0": attn, "m0": state}, 10**6, max_model_len=64, max_num_batched_tokens=32
    )
    assert plan.slot_bytes == 512 and plan.unified.notes == ()
    cfg = plan.kv_cache_config
    bufs = allocate_kv_cache(cfg)
    cache = bufs.layers["m0"]
    assert isinstance(cache, MambaCache)
    assert cache.conv.shape == cache.ssm.shape == (cfg.num_blocks, 2, 32)
    for view in (cache.conv, cache.ssm):
        view[3].fill_(1.2345679)  # float32 bytes 52 06 9e 3f: none is zero
    t, start, end = layer_byte_range(cfg, "m0", 3)
    assert end - start == 512
    assert _changed(bufs) == [(t, start, end)]  # conv and SSM fill the whole page


def test_views_need_the_element_alignment_of_their_dtype() -> None:
    """Views count in elements, so a slot or offset that is not a multiple of
    the element size would be rounded down in silence: a hand-made config
    with either is refused, naming both."""
    from hybridkv import FullAttentionSpec, MambaSpec

    attn = FullAttentionSpec(1, 1, 8, "float16")  # 32-byte pages
    odd_slot = KVCacheConfig(4, [KVCacheTensor(4 * 33, ["a"])], [KVCacheGroupSpec(["a"], attn)])
    with pytest.raises(ValueError, match="slot is 33 bytes and the offset 0"):
        allocate_kv_cache(odd_slot)
    # A float32 conv state and a float16 SSM state: 6-byte pages. Two layers of one
    # group share a 12-byte slot, so the second one's conv state starts at byte 6.
    state = MambaSpec(4, shapes=((1,), (1,)), dtypes=("float32", "float16"))
    group = KVCacheGroupSpec(["m0", "m1"], state)
    odd_offset = KVCacheConfig(4, [KVCacheTensor(4 * 12, ["m0", "m1"])], [group])
    with pytest.raises(ValueError, match="slot is 12 bytes and the offset 6"):
        allocate_kv_cache(odd_offset)
