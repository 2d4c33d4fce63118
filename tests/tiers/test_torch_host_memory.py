"""``HostTier`` over ``TorchHostMemory``: tensors of any dtype, in and out; on CUDA,
pinned buffers and a copy stream (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from tier_factories import fingerprint, key

from hybridkv.tiers import HostTier
from hybridkv.tiers.torch_memory import EventCompletion, TorchHostMemory


def parts(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(2, 16, 8, generator=g).to(torch.bfloat16).to(device),  # a K page
        torch.randn(3, 4, generator=g).to(device),  # a float32 state
    ]


def round_trip(device: str) -> None:
    tier = HostTier(fingerprint(), 1 << 20, TorchHostMemory(device))
    src = parts(device)
    assert tier.store(key(1), src).wait()
    assert tier.used_bytes == 2 * 16 * 8 * 2 + 3 * 4 * 4
    into = [torch.zeros_like(t) for t in src]
    transfer = tier.load(key(1), into=into)
    assert transfer is not None and transfer.wait()
    assert all(torch.equal(a, b) for a, b in zip(into, src, strict=True))
    raw = tier.load(key(1))
    assert raw is not None and raw.wait()
    assert torch.equal(raw.result[1].view(torch.float32).reshape(3, 4), src[1].cpu())
    with pytest.raises(ValueError, match="contiguous"):
        tier.store(key(2), [src[0].transpose(0, 1)])
    with pytest.raises(ValueError, match="into has parts of"):
        tier.load(key(1), into=[torch.zeros(3)])
    tier.check_integrity()
    tier.close()


def test_tensors_round_trip_on_the_cpu() -> None:
    round_trip("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory, copy stream)")
def test_tensors_round_trip_through_pinned_memory_on_cuda() -> None:
    round_trip("cuda")
    memory = TorchHostMemory("cuda")
    assert memory.allocate(64).is_pinned()
    # A store ordered after work queued on the current stream sees its result.
    tier = HostTier(fingerprint(), 1 << 26, memory)
    x = torch.zeros(1 << 20, device="cuda")
    x.add_(1.0)  # queued on the current stream, before the copy stream's copy
    assert tier.store(key(3), [x]).wait()
    out = torch.empty_like(x)
    loaded = tier.load(key(3), into=[out])
    assert loaded is not None and loaded.wait()
    assert bool((out == 1.0).all())
    tier.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory, copy stream)")
def test_a_batched_load_is_one_event_on_cuda() -> None:
    """``HostTier.load_parts`` on CUDA: every entry's copies on the copy stream,
    one event for the batch, the device tensors hold the stored bytes."""
    tier = HostTier(fingerprint(), 1 << 26, TorchHostMemory("cuda"))
    src = [torch.full((4096,), i, dtype=torch.uint8, device="cuda") for i in range(8)]
    assert all(t.wait() for t in tier.store_many([(key(i), [s], None) for i, s in enumerate(src)]))
    out = [torch.zeros_like(s) for s in src]
    (loaded,) = tier.load_parts([([key(i) for i in range(8)], [[o] for o in out])])
    assert isinstance(loaded.completion, EventCompletion) and loaded.wait()
    assert all(bool((o == i).all()) for i, o in enumerate(out))
    tier.check_integrity()
    tier.close()
