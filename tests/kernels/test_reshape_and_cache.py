"""reshape_and_cache: K/V rows land at their slots and nowhere else."""

from __future__ import annotations

import pytest
import torch
from paged_factory import strided_cache_views

from hybridkv.kernels import reshape_and_cache


def _setup(dtype, block_size=5, heads=2, dim=16, num_blocks=6, num_tokens=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    buf, kc, vc = strided_cache_views(num_blocks, block_size, heads, dim, dtype)
    buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
    key = torch.randn((num_tokens, heads, dim), generator=gen).to(dtype)
    value = torch.randn((num_tokens, heads, dim), generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[1, 4]] = -1  # skipped tokens
    return buf, kc, vc, key, value, slots.to(torch.int32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_writes_only_the_addressed_rows(backend, dtype):
    buf, kc, vc, key, value, slots = _setup(dtype)
    before = buf.clone()
    reshape_and_cache(key, value, kc, vc, slots, backend=backend)
    want_buf = before.clone()
    wk, wv = _views_like(want_buf, kc, vc)
    bs = kc.shape[1]
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            wk[slot // bs, slot % bs] = key[t]
            wv[slot // bs, slot % bs] = value[t]
    assert torch.equal(buf.view(torch.uint8), want_buf.view(torch.uint8))


def _views_like(buf, kc, vc):
    return (
        buf.as_strided(kc.shape, kc.stride(), kc.storage_offset()),
        buf.as_strided(vc.shape, vc.stride(), vc.storage_offset()),
    )


def test_triton_and_torch_agree_on_non_contiguous_inputs():
    buf, kc, vc, key, value, slots = _setup(torch.float32, num_tokens=7)
    wide = torch.randn(7, 2, 2, 16)
    key, value = wide[:, :, 0], wide[:, :, 1]  # token stride 64, head stride 32
    ref_buf = buf.clone()
    rk, rv = _views_like(ref_buf, kc, vc)
    reshape_and_cache(key, value, rk, rv, slots, backend="torch")
    reshape_and_cache(key, value, kc, vc, slots, backend="triton")
    assert torch.equal(buf, ref_buf)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "key": a["key"].to(torch.float16)}, "share one dtype"),
        (lambda a: {**a, "slot_mapping": a["slot_mapping"].float()}, "slot_mapping: dtype"),
        (lambda a: {**a, "slot_mapping": a["slot_mapping"][:-1]}, "slot_mapping: dimension 0"),
        (lambda a: {**a, "value": a["value"][:, :1]}, "value: dimension 1"),
        (lambda a: {**a, "key_cache": a["key_cache"].transpose(2, 3)}, "key_cache"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    _, kc, vc, key, value, slots = _setup(torch.float32)
    args = {"key": key, "value": value, "key_cache": kc, "value_cache": vc, "slot_mapping": slots}
    with pytest.raises(ValueError, match=message):
        reshape_and_cache(**change(args))
