"""What one attention or cache-write call costs on the host, counted so that it cannot grow.

On an H200 a batch-1 decode cost ~90-115 us whatever the context, where the
kernel's bytes need a few us: a fixed cost per call, on the host. Every aten
op there is a dispatch (and on CUDA a launch, ~5-10 us, unless it only
allocates or views), and a read of device memory (``.item()``, ``int(t)``,
``.tolist()``, ``nonzero``) stalls the host until the GPU catches up. Here the
Triton kernels are replaced by recorders, so that what remains is exactly the
Python around them, and a ``TorchDispatchMode`` lists its aten ops.

Counts (32 query / 8 KV heads, head 128, bf16; before -> after this file's
commit), for a call with the step's metadata already used by a layer:

- decode without a split: 1 aten op -> 1 (``empty_like``: the output; 0 with ``out=``);
- decode with a 16-way split: 4 -> 1 (the three partials buffers were
  allocated per call; now once per step in ``meta.derived``);
- bf16 sinks: +1 (``_to_copy``, a cast kernel per call) -> +0 (the kernels
  cast on load);
- ``reshape_and_cache``: 0 -> 0;
- host reads of device memory: 0 -> 0; device-property queries per call on
  CUDA: 1 (``get_device_properties`` for the split rule) -> 0 (its SM count, which
  the fill rule reads, is read once per device: ``launcher.device_sms``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import host_reads
import pytest
import torch
from host_reads import RecordOps
from paged_factory import PagedBatch, dense_oracle, make_paged_batch

import hybridkv.kernels.cache_write_triton as cache_write_triton
from hybridkv.kernels import AttentionMetadata, AttentionOptions, reshape_and_cache
from hybridkv.kernels.attention import launch_rules, launcher, unified_attention

#: Where the Triton path runs: compiled on CUDA when present (device tensors, so the
#: test shim passes the calls through untouched), else the interpreter on the CPU.
DEVICE = torch.device(
    "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
)

#: Host reads, and ``.cpu()`` / ``.to("cpu")``: here every tensor is on one device, so
#: any copy crosses devices.
HOST_READS = host_reads.HOST_READS | {"aten._to_copy.default"}
#: Per call with prepared metadata: ``empty_like`` for the output, nothing else.
MAX_ATTENTION_OPS = 1
MAX_CACHE_WRITE_OPS = 0


class _Recorder:
    """Stands for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` records the launch."""

    def __init__(self, name: str, launches: list[tuple[str, Any]]) -> None:
        self.name, self.launches = name, launches

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append((self.name, grid))

        return launch


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Kernel launches recorded instead of run; any device query or ``tolist`` fails."""
    got: list[tuple[str, Any]] = []
    if DEVICE.type == "cuda":
        # torch's lazy CUDA init queries device properties itself: done before the refusal.
        torch.cuda.init()
        torch.empty(1, device=DEVICE)
    # The split rule's SM count: read once per device and process (cached), not per call.
    launcher.device_sms(DEVICE)
    monkeypatch.setattr(launcher, "unified_attention_kernel", _Recorder("attention", got))
    monkeypatch.setattr(launcher, "reduce_segments_kernel", _Recorder("merge", got))
    monkeypatch.setattr(
        cache_write_triton, "_reshape_and_cache_kernel", _Recorder("cache_write", got)
    )

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a host read or device query on the hot path")

    monkeypatch.setattr(torch.Tensor, "tolist", refuse)
    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    monkeypatch.setattr(torch.cuda, "get_device_properties", refuse)
    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    yield got


def _ops(fn: Callable[[], object]) -> list[str]:
    with RecordOps() as mode:
        fn()
    assert not HOST_READS & set(mode.ops), mode.ops
    return mode.ops


def _decode(batch: int = 4, ctx: int = 4096, sinks: bool = False):
    hq, hkv, d, bs = 32, 8, 128, 16
    per = -(-ctx // bs)
    k = torch.zeros(batch * per + 1, bs, hkv, d, dtype=torch.bfloat16, device=DEVICE)
    table = (torch.arange(batch * per, dtype=torch.int32, device=DEVICE) + 1).view(batch, per)
    meta = AttentionMetadata.build([1] * batch, [ctx] * batch, table)
    q = torch.zeros(batch, hq, d, dtype=torch.bfloat16, device=DEVICE)
    s = torch.zeros(hq, dtype=torch.bfloat16, device=DEVICE) if sinks else None
    return q, k, torch.zeros_like(k), meta, s


@pytest.mark.parametrize("segments", [None, 16])
@pytest.mark.parametrize("sinks", [False, True])
def test_a_decode_with_prepared_metadata_runs_one_op_and_no_host_read(launches, segments, sinks):
    q, k, v, meta, s = _decode(sinks=sinks)
    opts = AttentionOptions(scale=0.1)

    def call(out: torch.Tensor | None = None) -> object:
        return unified_attention(
            q, k, v, meta, opts, sinks=s, out=out, backend="triton", num_segments=segments
        )

    # No segments given: split-KV is automatic on CUDA (one segment per 2,048 keys, or
    # more to fill the GPU: 4 sequences x 8 KV heads), none under the interpreter.
    split = segments or launch_rules.auto_segments(
        launch_rules.BatchKind.DECODE, 4096, launcher.device_sms(DEVICE), 4 * 8, 128
    )
    split = split if split > 1 else None
    first = _ops(call)  # the step's first layer: plans, and the partials once
    assert first.count("aten.empty.memory_format") == (1 if split else 0), first
    launches.clear()
    ops = _ops(call)
    assert ops == ["aten.empty_like.default"]  # the output
    assert len(ops) <= MAX_ATTENTION_OPS
    out = torch.empty_like(q)
    assert _ops(lambda: call(out=out)) == []
    want = [("attention", (4 // 4 + 4, 8, split or 1))]
    if split:
        want.append(("merge", (4, 32)))
    assert launches[: len(want)] == want


def test_layers_share_the_steps_plans(launches, monkeypatch):
    q, k, v, meta, _ = _decode()
    planned = []
    real = launcher.plan_launch
    monkeypatch.setattr(
        launcher, "plan_launch", lambda *a, **kw: planned.append(a) or real(*a, **kw)
    )
    full, sliding = AttentionOptions(scale=0.1), AttentionOptions(scale=0.1, sliding_window=64)
    for _ in range(3):  # three "layers" of each kind
        unified_attention(q, k, v, meta, full, backend="triton")
        unified_attention(q, k, v, meta, sliding, backend="triton")
    assert len(planned) == 2  # one plan per layer geometry and step
    assert meta.derived.checked == {(q.device, 16)}
    q2, k2, v2, meta2, _ = _decode()  # the next step: new metadata, new plans
    unified_attention(q2, k2, v2, meta2, full, backend="triton")
    assert len(planned) == 3


def test_a_cache_write_runs_no_op(launches):
    key = torch.zeros(256, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    kc = torch.zeros(64, 16, 8, 128, dtype=torch.bfloat16, device=DEVICE)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(1024, device=DEVICE)[:256]
    ops = _ops(lambda: reshape_and_cache(key, key, kc, vc, slots, backend="triton"))
    assert len(ops) <= MAX_CACHE_WRITE_OPS, ops
    assert launches == [("cache_write", (256,))]


@pytest.mark.parametrize("sinks_dtype", [torch.float32, torch.bfloat16])
def test_split_layers_sharing_the_partials_are_each_right(sinks_dtype):
    # Two layers (their own queries, caches and sinks) on one metadata, each split
    # 3 ways: the second reuses the partials buffer of the first, then the first again.
    opts = AttentionOptions(scale=0.3, sliding_window=40)
    a = make_paged_batch(
        [(70, 1), (5, 1), (129, 1)],
        num_heads=4,
        num_kv_heads=2,
        head_size=16,
        block_size=4,
        opts=opts,
        with_sinks=True,
        device=DEVICE,  # on CUDA the metadata (and the plans it keeps) is the test's own
    )
    gen = torch.Generator().manual_seed(1)
    b = PagedBatch(
        torch.randn(a.q.shape, generator=gen).to(DEVICE),
        a.key_cache * -1.3,  # NaN poison stays NaN
        a.value_cache * 0.7,
        a.meta,
        opts,
        torch.randn(4, generator=gen).to(DEVICE),
    )
    for layer in (a, b):
        layer.sinks = layer.sinks.to(sinks_dtype)
    for layer in (a, b, a):
        got = unified_attention(
            layer.q, layer.key_cache, layer.value_cache, a.meta, opts,
            sinks=layer.sinks, backend="triton", num_segments=3,
        )  # fmt: skip
        torch.testing.assert_close(got.double().cpu(), dense_oracle(layer), rtol=2e-5, atol=2e-5)
    assert len(a.meta.derived.workspace) == 1


def test_a_chunk_or_window_longer_than_every_sequence_launches_the_full_path(monkeypatch):
    flags: list[tuple[bool, bool, int, int]] = []

    class _Flags:
        def __getitem__(self, grid: Any) -> Callable[..., None]:
            def launch(*args: Any, **kw: Any) -> None:
                # positional: ..., sliding_window (17th) and chunk_size (18th) values
                flags.append((kw["USE_WINDOW"], kw["USE_CHUNK"], args[16], args[17]))

            return launch

    monkeypatch.setattr(launcher, "unified_attention_kernel", _Flags())
    q, k, v, meta, _ = _decode(ctx=4096)  # every sequence 4,096 long
    kinds = [{"chunk_size": 8192}, {"chunk_size": 4096}, {"sliding_window": 4096}]
    kinds += [{"chunk_size": 4095}, {"sliding_window": 64}]
    for kind in kinds:
        unified_attention(q, k, v, meta, AttentionOptions(scale=0.1, **kind), backend="triton")
    assert flags == [(False, False, 0, 0)] * 3 + [(False, True, 0, 4095), (True, False, 64, 0)]
