"""``UnitReads``: device units read into host memory a batch at a time. On the
CPU: views of the KV buffers, or copies the caller owns. The staging copy (the
CUDA path) on CPU tensors: every part in its own consecutive slice of one
buffer. On CUDA (skipped without it): one pinned staging buffer and one event
per batch, ordered after the work queued on the current stream."""

from __future__ import annotations

import pytest
import torch

from hybridkv.offload.unit_reads import UnitReads, stage


class FakeBlockBytes:
    """``BlockBytes.parts`` over one tensor per group: block ``b``'s parts are
    ``widths`` bytes each, one after another."""

    def __init__(self, device: str, widths: tuple[int, ...] = (24, 40), blocks: int = 6) -> None:
        self.widths = widths
        n = sum(widths)
        self.raw = [
            (torch.arange(blocks * n, dtype=torch.int64) * (g + 3) % 251).to(torch.uint8).to(device)
            for g in range(2)
        ]

    def parts(self, group_id: int, block_id: int) -> list[torch.Tensor]:
        out, off = [], block_id * sum(self.widths)
        for w in self.widths:
            out.append(self.raw[group_id][off : off + w])
            off += w
        return out


def _want(bb: FakeBlockBytes, g: int, b: int) -> list[bytes]:
    return [bytes(p.cpu().numpy()) for p in bb.parts(g, b)]


def test_on_the_cpu_views_or_owned_copies() -> None:
    bb = FakeBlockBytes("cpu")
    reads = UnitReads(bb)  # type: ignore[arg-type]
    units = [(0, 2), (1, 0), (0, 5)]
    views = reads.read(units)
    owned = reads.read(units, own=True)
    assert [[bytes(a) for a in u] for u in views] == [_want(bb, g, b) for g, b in units]
    assert [[bytes(a) for a in u] for u in owned] == [_want(bb, g, b) for g, b in units]
    bb.raw[0].zero_()  # the buffers are rewritten: views follow, owned copies do not
    assert not any(views[0][0]) and bytes(owned[0][0]) == _want(FakeBlockBytes("cpu"), 0, 2)[0]
    assert reads.read([]) == [] and reads.staged_batches == 0


def test_staging_puts_every_part_in_its_own_slice() -> None:
    bb = FakeBlockBytes("cpu")
    units = [(1, 4), (0, 1)]
    parts = [bb.parts(g, b) for g, b in units]
    staging = torch.full((2 * sum(bb.widths) + 8,), 255, dtype=torch.uint8)
    views = stage(parts, staging)
    assert [[bytes(v.numpy()) for v in vs] for vs in views] == [_want(bb, g, b) for g, b in units]
    offsets = [v.data_ptr() - staging.data_ptr() for vs in views for v in vs]
    assert offsets == [0, 24, 64, 88]  # back to back, in order
    assert bytes(staging[-8:].numpy()) == b"\xff" * 8  # nothing past the last part


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (pinned staging, copy stream)"
)
def test_on_cuda_one_pinned_staging_copy_per_batch() -> None:
    bb = FakeBlockBytes("cuda")
    want = [_want(bb, g, b) for g, b in [(0, 1), (1, 3)]]
    bb.raw[1].add_(1)  # queued on the current stream: the read must see it
    want[1] = [bytes((x + 1) % 256 for x in p) for p in want[1]]
    reads = UnitReads(bb)  # type: ignore[arg-type]
    got = reads.read([(0, 1), (1, 3)])
    assert [[bytes(a) for a in u] for u in got] == want and reads.staged_batches == 1
    # back to back in one pinned staging buffer
    assert got[1][0].ctypes.data - got[0][0].ctypes.data == sum(bb.widths)
    assert torch.from_numpy(got[1][1]).is_pinned()
