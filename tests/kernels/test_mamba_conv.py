"""causal_conv1d_update / causal_conv1d_fn: torch and Triton against an fp64 oracle."""

from __future__ import annotations

import pytest
import torch
from mamba_oracle import (
    SCENARIOS,
    Scenario,
    assert_only_slots_changed,
    clone_views,
    conv_oracle,
    state_views,
    varlen_oracle,
)

from hybridkv.kernels.mamba import causal_conv1d_fn, causal_conv1d_update

NUM_SLOTS = 8
BACKENDS = ["torch", "triton"]
# bf16: about one ulp (2^-7); Triton's interpreter also truncates fp32 -> bf16 instead of rounding.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _params(dim: int, width: int, dtype: torch.dtype, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(dim, width, generator=g) * 0.5).to(dtype)
    b = (torch.randn(dim, generator=g) * 0.1).to(dtype) if bias else None
    return weight, b


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize(("dim", "width", "bias"), [(8, 4, True), (13, 2, False), (19, 3, True)])
def test_update_matches_oracle(backend, state_dtype, activation, dim, width, bias):
    sv = state_views(NUM_SLOTS, (width - 1, dim), (2, 4), conv_dtype=state_dtype, seed=dim)
    before = clone_views(sv)
    weight, b = _params(dim, width, torch.float32, bias, seed=1)
    idx = [3, -1, 5, 1]  # one padding row
    x = torch.randn(len(idx), dim)
    out = causal_conv1d_update(
        x,
        sv.conv,
        weight,
        b,
        activation,
        conv_state_indices=torch.tensor(idx),
        backend=backend,
    )
    for row, slot in enumerate(idx):
        if slot < 0:
            assert torch.equal(out[row], torch.zeros(dim))
            continue
        want, states = conv_oracle(x[row : row + 1], weight, b, activation, before.conv[slot])
        _close(out[row], want[0], torch.float32)
        _close(sv.conv[slot], states[0].to(state_dtype), state_dtype)
    assert_only_slots_changed(before, sv, "conv", {3, 5, 1})


def _run_prefill(backend, sc: Scenario, sv, weight, b, activation, x, index_dtype=torch.int32):
    qsl, init, save = sc.tensors(index_dtype)
    return causal_conv1d_fn(x, weight, b, activation, sv.conv, qsl, init, save, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
@pytest.mark.parametrize(
    ("dim", "width", "bias", "activation", "state_dtype", "index_dtype"),
    [
        (8, 4, True, "silu", torch.float32, torch.int32),
        (11, 2, False, None, torch.float32, torch.int64),
        (16, 3, True, None, torch.bfloat16, torch.int32),
    ],
)
def test_prefill_matches_oracle(
    backend, sc, dim, width, bias, activation, state_dtype, index_dtype
):
    sv = state_views(NUM_SLOTS, (width - 1, dim), (2, 4), conv_dtype=state_dtype, seed=7)
    before = clone_views(sv)
    weight, b = _params(dim, width, torch.float32, bias, seed=2)
    x = torch.randn(sum(sc.lengths), dim)
    out = _run_prefill(backend, sc, sv, weight, b, activation, x, index_dtype)
    want, saves = varlen_oracle(
        lambda sl, init: conv_oracle(x[sl], weight, b, activation, init),
        before.conv,
        sc.qsl,
        list(sc.init),
        sc.save_idx,
    )
    _close(out, want, torch.float32)
    for slot, st in saves.items():
        _close(sv.conv[slot], st.to(state_dtype), state_dtype)
    assert_only_slots_changed(before, sv, "conv", sc.written)


@pytest.mark.parametrize(
    ("dtype", "state_dtype"), [(torch.float16, torch.float16), (torch.float16, torch.float32)]
)
@pytest.mark.parametrize("sc", SCENARIOS[1:3], ids=lambda s: s.name)
def test_triton_matches_torch_half(dtype, state_dtype, sc):
    dim, width = 24, 4
    weight, b = _params(dim, width, dtype, True, seed=3)
    x = torch.randn(sum(sc.lengths), dim).to(dtype)
    views = {}
    outs = {}
    for backend in BACKENDS:
        views[backend] = state_views(NUM_SLOTS, (width - 1, dim), (2, 4), state_dtype, seed=5)
        outs[backend] = _run_prefill(backend, sc, views[backend], weight, b, "silu", x)
    assert outs["triton"].dtype == dtype
    _close(outs["triton"], outs["torch"], dtype)
    torch.testing.assert_close(views["triton"].raw, views["torch"].raw, atol=0, rtol=0)
    idx = torch.tensor([2, 7, -1, 2], dtype=torch.int64)[:3]
    xd = torch.randn(3, dim).to(dtype)
    dec = {
        be: causal_conv1d_update(
            xd, views[be].conv, weight, b, "silu", conv_state_indices=idx, backend=be
        )
        for be in BACKENDS
    }
    _close(dec["triton"], dec["torch"], dtype)
    assert torch.equal(views["triton"].raw, views["torch"].raw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_and_decode_match_one_chunk(backend):
    """Tokens [0, 11) with block size 4: one chunk == three chunks == chunk + decode steps."""
    dim, width = 10, 4
    weight, b = _params(dim, width, torch.float32, True, seed=4)
    x = torch.randn(11, dim)
    one = state_views(NUM_SLOTS, (width - 1, dim), (2, 4), seed=1)
    save = torch.full((11,), -1)
    save[3], save[7], save[10] = 5, 6, 7  # checkpoints at block ends, final state
    full = causal_conv1d_fn(
        x,
        weight,
        b,
        "silu",
        one.conv,
        torch.tensor([0, 11]),
        torch.tensor([-1]),
        save,
        backend=backend,
    )

    # Chunks [0, 3), [3, 9), [9, 11), block entries 0 -> slot 1, 1 -> 2, 2 -> 3.
    sv = state_views(NUM_SLOTS, (width - 1, dim), (2, 4), seed=2)
    outs = []
    for (a, e), init, saves in [
        ((0, 3), -1, {2: 1}),
        ((3, 9), 1, {3: 1, 7: 2, 8: 3}),  # reads entry 0 and rewrites it at token 3
        ((9, 11), 3, {10: 3}),
    ]:
        s = torch.full((e - a,), -1)
        for t, slot in saves.items():
            s[t - a] = slot
        outs.append(
            causal_conv1d_fn(
                x[a:e],
                weight,
                b,
                "silu",
                sv.conv,
                torch.tensor([0, e - a]),
                torch.tensor([init]),
                s,
                backend=backend,
            )
        )
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-6, rtol=1e-6)
    for mine, ref in [(1, 5), (2, 6), (3, 7)]:
        torch.testing.assert_close(sv.conv[mine], one.conv[ref], atol=1e-6, rtol=1e-6)

    # Prefill [0, 9) then decode tokens 9 and 10 from the final state.
    dv = state_views(NUM_SLOTS, (width - 1, dim), (2, 4), seed=3)
    s = torch.full((9,), -1)
    s[8] = 4
    head = causal_conv1d_fn(
        x[:9],
        weight,
        b,
        "silu",
        dv.conv,
        torch.tensor([0, 9]),
        torch.tensor([-1]),
        s,
        backend=backend,
    )
    steps = [
        causal_conv1d_update(
            x[t : t + 1],
            dv.conv,
            weight,
            b,
            "silu",
            conv_state_indices=torch.tensor([4]),
            backend=backend,
        )
        for t in (9, 10)
    ]
    torch.testing.assert_close(torch.cat([head, *steps]), full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dv.conv[4], one.conv[7], atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_triton_matches_torch_bf16():
    dim, width, dev = 3 * 1024 + 2 * 128, 4, torch.device("cuda")
    weight, b = _params(dim, width, torch.bfloat16, True, seed=5)
    weight, b = weight.to(dev), b.to(dev)
    lengths = [300, 1, 77, 512]
    qsl = torch.tensor([0, 300, 301, 378, 890], device=dev)
    init = torch.tensor([3, -1, 5, 9], device=dev)
    save = torch.full((890,), -1, device=dev)
    save[torch.tensor([255, 299, 300, 377, 383, 889])] = torch.tensor(
        [3, 10, 11, 5, 12, 13], device=dev
    )
    x = torch.randn(sum(lengths), dim, device=dev).to(torch.bfloat16)
    # One set of initial states for both backends (each writes its own copy).
    conv0 = torch.randn(16, width - 1, dim + 64, device=dev)
    res = {}
    for backend in BACKENDS:
        conv = conv0.clone()[:, :, :dim]
        out = causal_conv1d_fn(x, weight, b, "silu", conv, qsl, init, save, backend=backend)
        idx = torch.tensor([13, -1, 11, 5], device=dev)
        dec = causal_conv1d_update(
            x[:4], conv, weight, b, "silu", conv_state_indices=idx, backend=backend
        )
        res[backend] = (out, dec, conv)
    for got, want in zip(res["triton"], res["torch"], strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
