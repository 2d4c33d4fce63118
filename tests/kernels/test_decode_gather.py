"""The reference decode gathers cache rows with one ``index_select`` over a strided
token-row view; it must equal ``cache[blocks, offsets]`` on every layout."""

from __future__ import annotations

import torch

from hybridkv.kernels.attention.reference import _gather, _token_rows


def _check(cache: torch.Tensor) -> None:
    nb, bs = cache.shape[:2]
    g = torch.Generator().manual_seed(nb * bs)
    blocks = torch.randint(0, nb, (3, 7), generator=g)
    offsets = torch.randint(0, bs, (3, 7), generator=g)
    assert torch.equal(_gather(cache, blocks, offsets), cache[blocks, offsets])


def test_shared_buffer_view_is_gathered_without_copy() -> None:
    # K and V of a layer interleaved per block in one buffer (the planner's layout),
    # the V view starting mid-buffer: block stride = 2 x block bytes.
    nb, bs, h, d = 9, 4, 2, 5
    buf = torch.randn(nb, 2, bs, h, d)
    key, value = buf[:, 0], buf[:, 1]
    rows = _token_rows(value)
    assert rows is not None and rows[1] == 2 * bs
    assert rows[0].data_ptr() == value.data_ptr()  # a view, not a copy
    _check(key)
    _check(value)


def test_layout_without_whole_row_strides_falls_back() -> None:
    nb, bs, h, d = 6, 4, 1, 3
    flat = torch.randn(nb * (bs * h * d + 1))
    cache = flat.as_strided((nb, bs, h, d), (bs * h * d + 1, h * d, d, 1))
    assert _token_rows(cache) is None
    _check(cache)


def test_contiguous_cache() -> None:
    _check(torch.randn(5, 8, 3, 4))
