"""The Mamba ops on the planner's real shared buffers (tiny-jamba, bf16 conv and SSM states).

tiny-jamba's Mamba1 layers share their buffers with attention layers, so the
state views have a slot stride larger than a Mamba page. A prefill chunk that
starts from slot 5, checkpoints into slot 5 (its own initial slot) and 9, then
a decode step on slot 9, must give the same results with Triton and torch and
must not touch a byte outside layer 0's conv/SSM rows of slots 5 and 9.
"""

from __future__ import annotations

import pytest
import torch

from hybridkv.kernels.mamba import (
    causal_conv1d_fn,
    causal_conv1d_update,
    selective_scan_fn,
    selective_state_update,
)
from hybridkv.layouts import shipped_layout
from hybridkv.planning import MambaCache, allocate_kv_cache, plan_kv_cache

D_INNER, D_STATE, WIDTH, T = 128, 8, 4, 7


def _setup():
    plan = plan_kv_cache(shipped_layout("tiny-jamba"), 1 << 22, block_size=4)
    kv = allocate_kv_cache(plan.kv_cache_config)
    g = torch.Generator().manual_seed(0)
    for buf in kv.buffers:
        buf.copy_(torch.randint(0, 256, buf.shape, dtype=torch.uint8, generator=g))
    layer = kv.layers["layers.0"]
    assert isinstance(layer, MambaCache)
    assert layer.conv.stride(0) > (WIDTH - 1) * D_INNER  # shares its slot with other layers
    for slot in (5, 9):  # finite initial states where the kernels read
        layer.conv[slot] = torch.randn(WIDTH - 1, D_INNER, generator=g).to(layer.conv.dtype)
        layer.ssm[slot] = torch.randn(D_INNER, D_STATE, generator=g).to(layer.ssm.dtype)
    return kv, layer


def _stages():
    """The four calls of a prefill chunk then a decode step, as (layer, backend) -> out."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T + 1, D_INNER, generator=g)
    w = torch.randn(D_INNER, WIDTH, generator=g) * 0.5
    dt = torch.randn(T + 1, D_INNER, generator=g) * 0.5 - 1
    A = -torch.exp(torch.randn(D_INNER, D_STATE, generator=g) * 0.5)
    B, C = torch.randn(2, T + 1, D_STATE, generator=g)
    D = torch.randn(D_INNER, generator=g)
    qsl, init = torch.tensor([0, T]), torch.tensor([5])
    save = torch.full((T,), -1)
    save[1], save[T - 1] = 5, 9  # a checkpoint into the initial slot, the final state
    idx = torch.tensor([9])
    xc = torch.randn(T, D_INNER, generator=g)  # conv outputs stand-ins for the scan input
    return [
        lambda m, be: causal_conv1d_fn(x[:T], w, None, "silu", m.conv, qsl, init, save, backend=be),
        lambda m, be: selective_scan_fn(
            xc, dt[:T], A, B[:T], C[:T], D, None, None, True, m.ssm, qsl, init, save, backend=be
        ),
        lambda m, be: causal_conv1d_update(
            x[T:], m.conv, w, None, "silu", conv_state_indices=idx, backend=be
        ),
        lambda m, be: selective_state_update(
            m.ssm,
            xc[:1],
            dt[T:],
            A,
            B[T:],
            C[T:],
            D,
            None,
            None,
            True,
            state_indices=idx,
            backend=be,
        ),
    ]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_only_layer0_slots_change(backend):
    kv, layer = _setup()
    before = [b.clone() for b in kv.buffers]
    for stage in _stages():
        stage(layer, backend)
    for i, (buf, old) in enumerate(zip(kv.buffers, before, strict=True)):
        expect = old.clone()
        for v in (layer.conv, layer.ssm):
            if v.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
                continue
            view = expect.view(v.dtype).as_strided(v.shape, v.stride(), v.storage_offset())
            view[[5, 9]] = v[[5, 9]]
        assert torch.equal(expect, buf), f"buffer {i}: bytes outside layer 0's slots 5, 9 changed"


def test_triton_matches_torch_op_by_op():
    """Each call starts both backends from the same bytes. Outputs (fp32) must agree to
    fp32 precision; saved bf16 states to one bf16 ulp, because Triton's interpreter
    truncates fp32 -> bf16 where torch (and GPUs) round to nearest even."""
    (kv_t, lt), (kv_r, lr) = _setup(), _setup()
    for stage in _stages():
        got, want = stage(lt, "triton"), stage(lr, "torch")
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for a, b in ((lt.conv, lr.conv), (lt.ssm, lr.ssm)):
            a, b = a[[5, 9]].float(), b[[5, 9]].float()
            ulp = torch.finfo(torch.bfloat16).eps * b.abs()  # 2^-7 |x| >= one ulp
            assert ((a - b).abs() <= ulp).all()
        for bt, br in zip(kv_t.buffers, kv_r.buffers, strict=True):
            bt.copy_(br)
