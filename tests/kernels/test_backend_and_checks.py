"""Backend choice (no silent fallback) and argument checks of the attention API."""

from __future__ import annotations

import pytest
import torch
from paged_factory import make_paged_batch

from hybridkv.kernels import (
    AttentionMetadata,
    AttentionOptions,
    KernelBackendError,
    resolve_backend,
    unified_attention,
)

CPU = torch.device("cpu")


def test_default_is_torch_on_cpu(monkeypatch):
    monkeypatch.delenv("HYBRIDKV_KERNEL_BACKEND", raising=False)
    assert resolve_backend(None, CPU) == "torch"


def test_environment_variable_and_explicit_override(monkeypatch):
    monkeypatch.setenv("HYBRIDKV_KERNEL_BACKEND", "triton")
    assert resolve_backend(None, CPU) == "triton"  # the interpreter is on in tests
    assert resolve_backend("torch", CPU) == "torch"
    monkeypatch.setenv("HYBRIDKV_KERNEL_BACKEND", "cuda-graphs")
    with pytest.raises(KernelBackendError, match="HYBRIDKV_KERNEL_BACKEND='cuda-graphs'"):
        resolve_backend(None, CPU)


def test_triton_on_cpu_without_the_interpreter_is_an_error(monkeypatch, native_triton_checks):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelBackendError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", CPU)


def test_unknown_and_unoffered_backends():
    with pytest.raises(KernelBackendError, match="unknown backend"):
        resolve_backend("cuda", CPU)
    with pytest.raises(KernelBackendError, match="offers only"):
        resolve_backend("mamba_ssm", CPU)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": 0.0}, "scale"),
        ({"scale": 1.0, "sliding_window": 0}, "sliding_window"),
        ({"scale": 1.0, "chunk_size": -4}, "chunk_size"),
        ({"scale": 1.0, "sliding_window": 4, "chunk_size": 8}, "exclusive"),
        ({"scale": 1.0, "softcap": 0.0}, "softcap"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttentionOptions(**kwargs)


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "rows", "message"),
    [
        ([3, 0], [3, 4], 2, r"query_lens\[1\] = 0"),
        ([3, 5], [3, 4], 2, r"seq_lens\[1\] = 4 is shorter"),
        ([3], [3, 4], 2, "entries"),
        ([3, 1], [3, 4], 3, "rows for 2 sequences"),
    ],
)
def test_bad_metadata(query_lens, seq_lens, rows, message):
    with pytest.raises(ValueError, match=message):
        AttentionMetadata.build(query_lens, seq_lens, torch.zeros(rows, 4, dtype=torch.int32))


def _batch():
    opts = AttentionOptions(scale=0.5)
    return make_paged_batch(
        [(3, 2), (5, 1)], num_heads=4, num_kv_heads=2, head_size=16, block_size=4, opts=opts
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: {"q": b.q[:, :3]}, "not a multiple"),
        (lambda b: {"q": b.q[:2]}, "q has 2 tokens but meta describes 3"),
        (lambda b: {"q": b.q.half()}, "share one dtype"),
        (lambda b: {"q": b.q.int()}, "q: dtype"),
        (lambda b: {"q": b.q.transpose(1, 2).contiguous().transpose(1, 2)}, "stride 1"),
        (lambda b: {"value_cache": b.value_cache[:, :2]}, "value_cache: dimension 1"),
        (lambda b: {"sinks": torch.zeros(3)}, "sinks: dimension 0"),
        (lambda b: {"out": torch.empty(3, 4, 16, dtype=torch.float16)}, "out: dtype"),
        (
            lambda b: {"key_cache": b.key_cache[:, :1], "value_cache": b.value_cache[:, :1]},
            "needs 6 blocks of 1",
        ),
    ],
)
def test_bad_attention_input_names_the_argument(change, message):
    b = _batch()
    args = {
        "q": b.q,
        "key_cache": b.key_cache,
        "value_cache": b.value_cache,
        "meta": b.meta,
        "opts": b.opts,
        "sinks": None,
        "out": None,
    }
    args.update(change(b))
    with pytest.raises(ValueError, match=message):
        unified_attention(**args)


def test_out_is_written_in_place():
    b = _batch()
    out = torch.full_like(b.q, float("nan"))
    got = unified_attention(b.q, b.key_cache, b.value_cache, b.meta, b.opts, out=out)
    assert got is out
    assert torch.isfinite(out).all()
