"""Our Mamba ops against mamba-ssm's own references and Triton kernel (skipped without it)."""

from __future__ import annotations

import contextlib
import importlib
import sys

import pytest
import torch
from hf_configs import TINY_JAMBA_LAYERS
from mamba_oracle import state_views

from hybridkv.kernels.backend import KernelBackendError
from hybridkv.kernels.mamba import (
    load_mamba_ssm,
    mamba_ssm_available,
    selective_scan_fn,
    selective_state_update,
    ssd_chunk_scan_fn,
    ssd_scan_fn,
    ssd_state_update,
)

pytestmark = pytest.mark.skipif(not mamba_ssm_available(), reason="mamba-ssm not installed")

D_INNER, D_STATE = 12, 6
HEADS, HEAD_DIM, GROUPS, N = 4, 6, 2, 5


def _r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _mamba1(n: int, seed: int) -> dict[str, torch.Tensor]:
    return {
        "x": _r(n, D_INNER, seed=seed),
        "dt": _r(n, D_INNER, seed=seed + 1) * 0.5 - 1,
        "A": -torch.exp(_r(D_INNER, D_STATE, seed=seed + 2) * 0.5),
        "B": _r(n, D_STATE, seed=seed + 3),
        "C": _r(n, D_STATE, seed=seed + 4),
        "D": _r(D_INNER, seed=seed + 5),
        "z": _r(n, D_INNER, seed=seed + 6),
        "dt_bias": _r(D_INNER, seed=seed + 7) * 0.1,
    }


def _mamba2(n: int, seed: int) -> dict[str, torch.Tensor]:
    return {
        "x": _r(n, HEADS, HEAD_DIM, seed=seed),
        "dt": _r(n, HEADS, seed=seed + 1) * 0.5 - 1,
        "A": -torch.exp(_r(HEADS, seed=seed + 2) * 0.5),
        "B": _r(n, GROUPS, N, seed=seed + 3),
        "C": _r(n, GROUPS, N, seed=seed + 4),
        "D": _r(HEADS, seed=seed + 5),
        "z": _r(n, HEADS, HEAD_DIM, seed=seed + 6),
        "dt_bias": _r(HEADS, seed=seed + 7) * 0.1,
    }


def _tied(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Mamba2 per-head scalars in mamba-ssm's tied-head decode format (stride-0 expands)."""
    b = p["x"].shape[0]
    return {
        **p,
        "dt": p["dt"][:, :, None].expand(b, HEADS, HEAD_DIM),
        "A": p["A"][:, None, None].expand(HEADS, HEAD_DIM, N),
        "D": p["D"][:, None].expand(HEADS, HEAD_DIM),
        "dt_bias": p["dt_bias"][:, None].expand(HEADS, HEAD_DIM),
    }


ORDER = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")


def test_loader_leaves_mamba_ssm_unimportable():
    load_mamba_ssm()
    assert "mamba_ssm" not in sys.modules and "selective_scan_cuda" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("mamba_ssm")
    tf_utils = pytest.importorskip("transformers.utils.import_utils")
    if not torch.cuda.is_available():
        assert not tf_utils.is_mamba_ssm_available()
    jamba = importlib.import_module("transformers.models.jamba.modeling_jamba")
    importlib.import_module("transformers.models.bamba.modeling_bamba")
    cfg = jamba.JambaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **TINY_JAMBA_LAYERS,
    )
    model = jamba.JambaForCausalLM(cfg).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4, 5]])).logits
    assert logits.shape == (1, 5, 64) and torch.isfinite(logits).all()


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_state_update_matches_mamba_ssm_ref(variant):
    ref = load_mamba_ssm().selective_state_update_ref
    idx = torch.tensor([3, 1, 6])
    if variant == "mamba1":
        p, ours = _mamba1(3, seed=1), selective_state_update
        sv = state_views(8, (3, 4), (D_INNER, D_STATE), seed=2)
        theirs_p = p
    else:
        p, ours = _mamba2(3, seed=1), ssd_state_update
        sv = state_views(8, (3, 4), (HEADS, HEAD_DIM, N), seed=2)
        theirs_p = _tied(p)
    theirs_state = sv.ssm[idx].clone()
    want = ref(theirs_state, *(theirs_p[k] for k in ORDER), dt_softplus=True)
    got = ours(sv.ssm, *(p[k] for k in ORDER), True, state_indices=idx, backend="torch")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sv.ssm[idx], theirs_state, atol=1e-5, rtol=1e-5)


def test_selective_scan_matches_mamba_ssm_ref():
    """Two sequences of 9 tokens from zero states; mamba-ssm wants (batch, dim, L)."""
    L = 9
    p = _mamba1(2 * L, seed=3)
    sv = state_views(8, (3, 4), (D_INNER, D_STATE), seed=4)
    save = torch.full((2 * L,), -1)
    save[L - 1], save[2 * L - 1] = 5, 2
    qsl, init = torch.tensor([0, L, 2 * L]), torch.tensor([-1, -1])
    got = selective_scan_fn(*(p[k] for k in ORDER), True, sv.ssm, qsl, init, save, backend="torch")

    def bdl(t: torch.Tensor) -> torch.Tensor:  # [2L, F] -> [2, F, L]
        return t.reshape(2, L, -1).transpose(1, 2)

    want, last = load_mamba_ssm().selective_scan_ref(
        bdl(p["x"]),
        bdl(p["dt"]),
        p["A"],
        bdl(p["B"]),
        bdl(p["C"]),
        p["D"],
        bdl(p["z"]),
        p["dt_bias"],
        delta_softplus=True,
        return_last_state=True,
    )
    torch.testing.assert_close(bdl(got), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sv.ssm[torch.tensor([5, 2])], last, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("op", "backend"),
    [(ssd_scan_fn, "torch"), (ssd_chunk_scan_fn, "triton")],
    ids=["ssd_scan_torch", "ssd_chunk_scan_triton"],
)
@pytest.mark.parametrize("length", [8, 12])
def test_ssd_scan_matches_mamba_ssm_chunk_scan_ref(length, op, backend):
    p = _mamba2(2 * length, seed=5)
    sv = state_views(8, (3, 4), (HEADS, HEAD_DIM, N), seed=6)
    qsl, init = torch.tensor([0, length, 2 * length]), torch.tensor([-1, -1])
    save = torch.full((2 * length,), -1)
    got = op(*(p[k] for k in ORDER), True, sv.ssm, qsl, init, save, backend=backend)

    def bl(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(2, length, *t.shape[1:])

    want = load_mamba_ssm().ssd_chunk_scan_combined_ref(
        bl(p["x"]),
        bl(p["dt"]),
        p["A"],
        bl(p["B"]),
        bl(p["C"]),
        4,
        D=p["D"],
        z=bl(p["z"]),
        dt_bias=p["dt_bias"],
        dt_softplus=True,
    )
    torch.testing.assert_close(bl(got), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_mamba_ssm_backend_in_interpreter(variant, monkeypatch):
    """mamba-ssm's Triton kernel through backend='mamba_ssm' (its launcher wants a CUDA
    device context, neutralised here only)."""
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU tests")
    monkeypatch.setattr(torch.cuda, "device", lambda _idx: contextlib.nullcontext())
    idx = torch.tensor([3, -1, 6])
    if variant == "mamba1":
        p, op, tail = _mamba1(3, seed=7), selective_state_update, (D_INNER, D_STATE)
    else:
        p, op, tail = _mamba2(3, seed=7), ssd_state_update, (HEADS, HEAD_DIM, N)
    res = {}
    for backend in ("torch", "mamba_ssm"):
        sv = state_views(8, (3, 4), tail, seed=8)
        out = op(sv.ssm, *(p[k] for k in ORDER), True, state_indices=idx, backend=backend)
        res[backend] = (out, sv.raw)
    torch.testing.assert_close(res["mamba_ssm"][0], res["torch"][0], atol=1e-5, rtol=1e-5)
    a = state_views(8, (3, 4), tail, seed=8)
    a.raw.copy_(res["mamba_ssm"][1])
    b = state_views(8, (3, 4), tail, seed=8)
    b.raw.copy_(res["torch"][1])
    torch.testing.assert_close(a.ssm, b.ssm, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.conv, b.conv, atol=0, rtol=0)


def test_gated_norm_is_mamba_ssm_per_group_norm():
    # Mamba2's norm after the scan: mamba-ssm's Mamba2 builds
    # RMSNormGated(d_ssm, group_size=d_ssm // ngroups, norm_before_gate=False). Our
    # GatedRMSNorm (Bamba, Granite 4.0 H) is that; transformers' is from 5.23.0 only.
    from hybridkv.models.mamba2_mixer import GatedRMSNorm

    ref = load_mamba_ssm().rms_norm_ref
    size, group = HEADS * HEAD_DIM, HEADS * HEAD_DIM // GROUPS
    scale = torch.tensor([1.0, 4.0]).repeat_interleave(group)  # groups of unlike RMS
    y, gate, weight = _r(5, size, seed=11) * scale, _r(5, size, seed=12), _r(size, seed=13)
    norm = GatedRMSNorm(size, group, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(weight)
        ours = norm(y, gate)
    want = ref(y, weight, None, z=gate, eps=1e-5, group_size=group, norm_before_gate=False)
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)
    whole = ref(y, weight, None, z=gate, eps=1e-5, group_size=None, norm_before_gate=False)
    assert not torch.allclose(whole, want, atol=1e-2)  # one group over all would differ


def test_mamba_ssm_backend_needs_cuda_or_interpreter(monkeypatch, native_triton_checks):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    p = _mamba1(2, seed=9)
    sv = state_views(4, (3, 4), (D_INNER, D_STATE), seed=1)
    with pytest.raises(KernelBackendError, match="mamba_ssm"):
        selective_state_update(
            sv.ssm,
            *(p[k] for k in ORDER),
            True,
            state_indices=torch.tensor([1, 2]),
            backend="mamba_ssm",
        )
