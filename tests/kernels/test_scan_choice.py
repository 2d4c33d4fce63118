"""The ``triton`` backend's choice of Mamba2 scan (``kernels/mamba/scan_choice.py``)."""

from __future__ import annotations

import pytest
import torch

from hybridkv.kernels import get_backend
from hybridkv.kernels.mamba import scan_choice, ssd_scan_fn


@pytest.mark.parametrize(
    ("tokens", "seqs", "chunked"),
    [
        (4096, 1, True),  # one long prefill
        (512, 8, True),  # 8 x 512, the smallest measured win
        (512, 1, True),
        (511, 1, False),  # short step
        (64, 64, False),  # a decode step: one token per sequence
        (2048, 64, False),  # a long prefill among 63 decodes: not measured, sequential
        (4096, 64, True),
    ],
)
def test_the_rule(tokens: int, seqs: int, chunked: bool) -> None:
    assert scan_choice.use_chunked(tokens, seqs) is chunked


def _inputs(lengths: list[int]) -> tuple:
    g = torch.Generator().manual_seed(0)
    t, h, p, n, groups = sum(lengths), 4, 16, 16, 2
    x = torch.randn(t, h, p, generator=g)
    dt = torch.randn(t, h, generator=g)
    A = -torch.rand(h, generator=g) - 0.5
    B = torch.randn(t, groups, n, generator=g)
    C = torch.randn(t, groups, n, generator=g)
    D = torch.randn(h, generator=g)
    bias = torch.randn(h, generator=g)
    state = torch.zeros(4, h, p, n)
    qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    init = torch.full((len(lengths),), -1, dtype=torch.int32)
    save = torch.full((t,), -1, dtype=torch.int32)
    save[qsl[1:].long() - 1] = torch.arange(len(lengths), dtype=torch.int32)  # final states
    if t > 20:
        save[20] = 3  # and one inside the first sequence
    return x, dt, A, B, C, D, None, bias, True, state, qsl, init, save


@pytest.mark.parametrize("lengths", [[40, 30], [1, 1]])
def test_the_backend_runs_the_chosen_scan_with_the_same_result(monkeypatch, lengths) -> None:
    # Thresholds lowered so that a tiny batch takes the chunked path under the interpreter.
    monkeypatch.setattr(scan_choice, "CHUNKED_MIN_TOKENS", 16)
    monkeypatch.setattr(scan_choice, "CHUNKED_MIN_PER_SEQ", 8)
    calls = []
    import hybridkv.kernels.mamba as mamba

    real = mamba.ssd_chunk_scan_fn

    def spy(*a, **k):
        calls.append(a[0].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(mamba, "ssd_chunk_scan_fn", spy)
    args = _inputs(lengths)
    want_state = args[9].clone()
    want = ssd_scan_fn(*args[:9], want_state, *args[10:], backend="torch")
    got = get_backend("triton", torch.device("cpu")).ssd_scan(*args)
    assert calls == ([sum(lengths)] if sum(lengths) >= 16 else [])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(args[9], want_state, rtol=1e-4, atol=1e-4)
