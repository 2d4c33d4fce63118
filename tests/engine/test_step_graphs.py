"""Steps replayed from graphs (``hybridkv.engine.graphs``).

On the CPU the graphs are ``EagerReplay``: each replay re-runs the captured step over
the same static inputs (token ids, positions, metadata tensors, slot mappings) with
the metadata's host values of the capture, as a CUDA graph would. So these tests
check what a graph depends on besides the capture itself: every value a step
changes reaches the static tensors, padding rows change nothing, and nothing on the
decode path reads the stale host values. On a GPU the same generation runs with real
CUDA graphs, against the eager engine and transformers.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from graph_checks import captured_step_host_reads
from host_reads import HOST_READS, RecordOps
from oracle import check_against_hf
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.graphs import (
    EagerReplay,
    StaticStep,
    StepGraphs,
    StepShape,
    bucket_sizes,
    span_class,
    unsupported_reason,
)
from hybridkv.engine.graphs.packed import HostTable, PackedInts
from hybridkv.engine.graphs.shapes import MIN_SPAN
from hybridkv.models.gemma3 import Gemma3ForCausalLM

CUDA = torch.cuda.is_available()


class _HostReading:
    """A model class that does not declare graphs (every family does by now)."""

    supports_cuda_graphs = False


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Two layers, one of each kind: the interpreter runs every Triton kernel per program.
    config = gemma3_config(
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return save_checkpoint(config, tmp_path_factory.mktemp("gemma3-graphs"))


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 11, 12, 14)]


def _generate(llm: LLM) -> list[list[int]]:
    # Different lengths: the batch shrinks 5 -> 1 as requests finish, crossing buckets.
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 4, 6, 8, 11)]
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts()], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _ask(llm: LLM) -> list[tuple[list[int], int]]:
    """Two questions on one 40-token document, one by one: (tokens, cached tokens)."""
    g = torch.Generator().manual_seed(5)
    doc = torch.randint(3, 500, (40,), generator=g).tolist()
    questions = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (3, 15)]
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    outs = []
    for q in questions:
        o = llm.generate({"prompt_token_ids": doc + q}, params, use_tqdm=False)[0]
        outs.append((list(o.outputs[0].token_ids), o.num_cached_tokens))
    return outs


def _mixed(llm: LLM) -> list[list[int]]:
    """Six prompts, three running at a time (``max_num_seqs=3``): new prompts are
    admitted while others decode (steps mixing prefills and decodes), and with
    ``max_num_batched_tokens=16`` the longer prompts are split into chunks that do not
    sample."""
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (4, 30, 9, 21, 3, 12)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 2, 4, 2, 3, 2)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_buckets_and_span_classes():
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(3) == (1, 2, 3)
    assert bucket_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert bucket_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert span_class(5, 256) == 256  # never past max_model_len
    assert span_class(5, 32768) == 512 == MIN_SPAN
    assert span_class(513, 32768) == 1024
    assert span_class(2048, 32768) == 2048
    assert span_class(2049, 32768) == 4096
    assert span_class(30000, 32768) == 32768


def _work(*steps: tuple[int, int, bool]) -> list[SimpleNamespace]:
    return [SimpleNamespace(start=a, num_tokens=n, samples=smp) for a, n, smp in steps]


def test_which_steps_are_graphed_and_at_what_shape():
    buckets = bucket_sizes(17)  # max_batch 16, + room for a padding sequence
    of = StepShape.of
    assert of(_work((100, 1, True)) * 3, buckets, 32768, 2048) == StepShape(4, 4, 2048, True)
    shape = of(_work((3000, 1, True), (5, 1, True)), buckets, 32768, 2048)
    assert shape == StepShape(tokens=2, seqs=2, span=4096, decode=True)
    assert of(_work((7, 1, True)) * 16, buckets, 32768, 2048).seqs == 16
    # Small steps: a sequence bucket with a padding sequence, a token bucket with
    # room for one padding token per padding sequence.
    assert of(_work((2048, 36, True)), buckets, 32768, 2048) == StepShape(64, 2, 4096, False)
    assert of(_work((0, 15, True)), buckets, 32768, 2048).tokens == 16
    assert of(_work((0, 16, True)), buckets, 32768, 2048).tokens == 32
    assert of(_work((0, 511, True)), buckets, 32768, 2048).tokens == 512
    mixed = _work((0, 5, True), (9, 1, True), (40, 1, True))
    assert of(mixed, buckets, 32768, 2048) == StepShape(16, 4, 2048, False)
    # 3 requests, 14 tokens: bucket 4 sequences, 16 tokens leave 2 for 1 padding seq.
    assert of(_work((0, 12, True), (9, 1, True), (40, 1, True)), buckets, 32768, 2048).tokens == 16
    # 15 requests, 15 tokens but one not sampling: padded to 16 seqs, 16 tokens.
    not_all = _work((0, 1, False)) + _work((9, 1, True)) * 14
    assert of(not_all, buckets, 32768, 2048) == StepShape(16, 16, 2048, False)
    assert of(_work((0, 512, True)), buckets, 32768, 2048) == "step of over 511 new tokens"
    assert of(_work((0, 40, True)), buckets, 32, 8) == "step of over 31 new tokens"
    assert of(_work((7, 2, True)) * 17, buckets, 32768, 2048) == "step of over 16 requests"
    assert of(_work((7, 1, True)) * 18, buckets, 32768, 2048) == "decode batch over 17"
    assert of([], buckets, 32768, 2048) == "empty step"


def test_replayed_decode_steps_give_the_eager_tokens(ckpt: Path):
    kw = dict(kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=8)
    want = _generate(LLM(ckpt, **kw))
    llm = LLM(ckpt, **kw)
    # Span classes from 8 keys: contexts of 6-25 tokens cross 16, so
    # buckets are captured again for longer contexts, as at 2,048+ on a GPU.
    graphs = StepGraphs(llm.runner, 8, llm.max_model_len, graph_factory=EagerReplay)
    graphs.min_span = 8
    llm.runner.graphs = graphs
    got = _generate(llm)
    assert got == want
    assert graphs.stats["decode replays"] >= 10  # the longest request's decodes at least
    assert graphs.stats["small-step replays"] >= 1  # the five prompts' prefill
    assert graphs.stats["captures"] == len(graphs.graphs)
    buckets = {shape.seqs for shape in graphs.graphs if shape.decode}
    spans = {shape.span for shape in graphs.graphs if shape.decode}
    assert {1, 2, 4, 8} <= buckets, graphs.graphs.keys()
    assert len(spans) >= 2, graphs.graphs.keys()
    llm.manager.check_integrity()


def test_prefix_hits_replay_the_short_prefill_they_leave(ckpt: Path):
    # Questions on a shared document, asked one by one. Each prompt is one step of
    # one request (43-55 tokens cold, 3 or 15 after a hit): the step a graph of one
    # request and a dummy sequence replays.
    kw = dict(kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=2)
    want = _ask(LLM(ckpt, **kw))
    llm = LLM(ckpt, **kw)
    graphs = StepGraphs(llm.runner, 2, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    got = _ask(llm)
    assert got == want
    assert got[0][1] == 0 and got[1][1] == 40  # the second hit the document's 10 blocks
    assert graphs.stats["small-step replays"] == 2, graphs.stats
    assert graphs.stats["decode replays"] == 2, graphs.stats
    prefills = {shape.tokens for shape in graphs.graphs if not shape.decode}
    assert prefills == {64, 16}  # 43 tokens cold; 15 after the hit (+1 padding: 16 is full)
    llm.manager.check_integrity()


def test_mixed_steps_and_middle_chunks_replay_as_the_eager_engine(ckpt: Path):
    kw = dict(kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=3)
    want = _mixed(LLM(ckpt, **kw, max_num_batched_tokens=16))
    llm = LLM(ckpt, **kw, max_num_batched_tokens=16)
    graphs = StepGraphs(llm.runner, 3, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    assert _mixed(llm) == want
    mixed = [s for s in graphs.graphs if not s.decode and s.seqs > 2]
    assert mixed, graphs.graphs.keys()  # steps of several requests, prefills among them
    assert graphs.stats["small-step replays"] >= 5, graphs.stats
    assert not any(k.startswith("eager") for k in graphs.stats), graphs.stats
    llm.manager.check_integrity()


def test_a_small_step_fills_its_static_tensors_exactly(ckpt: Path):
    # Worked example: a middle chunk (3 tokens at 8, not sampling), a decode (at 5) and
    # a new prompt of 4 tokens, in a 16-token, 4-sequence shape: 8 padding tokens in
    # one padding sequence. Block size 4; one attention group per layer kind.
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    runner = llm.runner
    groups = list(runner.config.kv_cache_groups)
    shape = StepShape(tokens=16, seqs=4, span=64, decode=False)
    static = StaticStep.make(shape, groups, runner.buffers, llm.max_model_len, runner.device)
    ids = list(range(100, 120))

    def req(start: int, n: int, samples: bool) -> SimpleNamespace:
        core = SimpleNamespace(all_token_ids=ids)
        return SimpleNamespace(request=SimpleNamespace(core=core), start=start, num_tokens=n,
                               samples=samples)  # fmt: skip

    work = [req(8, 3, False), req(5, 1, True), req(0, 4, True)]
    tables = [[7, 8, 9], [3, 4], [11]]  # each group gets the same ids here
    sampled = static.fill(work, [tuple(t for _ in groups) for t in tables])
    assert sampled == 2
    assert static.input_ids.tolist() == [108, 109, 110, 105, 100, 101, 102, 103] + [0] * 8
    assert static.positions.tolist() == [8, 9, 10, 5, 0, 1, 2, 3] + [0] * 8
    # The decode's last token is row 3, the new prompt's row 7; the chunk samples nothing.
    assert static.logits_indices.tolist() == [3, 7, 0, 0]
    for meta, slot in zip(static.metas, static.slots, strict=True):
        assert meta.query_start_loc.tolist() == [0, 3, 4, 8, 16]
        assert meta.seq_lens.tolist() == [11, 6, 4, 8]
        assert meta.block_table[:, :3].tolist() == [[7, 8, 9], [3, 4, 0], [11, 0, 0], [0, 0, 0]]
        # slot = block * 4 + position % 4
        assert slot.tolist() == [36, 37, 38, 17, 44, 45, 46, 47] + [-1] * 8


def test_a_graph_made_inside_inference_mode_replays_outside_it(ckpt: Path):
    # The runner calls run() under inference mode, a profiler's wrapper may not: the
    # static tensors are inference tensors either way (in-place writes to them outside
    # inference mode raised before).
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=2)
    graphs = StepGraphs(llm.runner, 2, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2), use_tqdm=False)
    params = SamplingParams(max_tokens=2)
    llm.scheduler.add_request(
        EngineRequest("x", [5, 6, 7, 8], params, max_model_len=llm.max_model_len)
    )
    work = llm.scheduler.schedule().scheduled
    assert not torch.is_inference_mode_enabled()
    logits = graphs.run(work)
    assert logits is not None and logits.shape[0] == 1
    assert graphs.stats["small-step replays"] == 2  # the first prompt's, then this one


def test_a_captured_step_reads_nothing_back_from_the_device(ckpt: Path):
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    assert captured_step_host_reads(llm) == set()
    with RecordOps() as seen:  # what a host read looks like here
        torch.ones(2).sum().item()
    assert HOST_READS & set(seen.ops)


def test_engines_that_cannot_be_graphed_are_refused_with_the_reason(ckpt: Path):
    cuda = torch.device("cuda")  # a device type only: nothing runs on it
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    config = llm.kv_cache_config
    assert unsupported_reason(Gemma3ForCausalLM, config, "triton", cuda) == ""
    cpu = torch.device("cpu")
    assert "CUDA device" in unsupported_reason(Gemma3ForCausalLM, config, "triton", cpu)
    assert "kernel_backend='triton'" in unsupported_reason(Gemma3ForCausalLM, config, "torch", cuda)
    why = unsupported_reason(_HostReading, config, "triton", cuda)
    assert why.startswith("_HostReading reads host values")
    if not CUDA:
        with pytest.raises(ValueError, match=r"cuda_graphs=True: CUDA graphs need a CUDA device"):
            LLM(ckpt, device="cpu", cuda_graphs=True)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_cuda_graphs_on_the_gpu_match_the_eager_engine_and_transformers(ckpt: Path):
    kw = dict(device="cuda", kernel_backend="triton", block_size=4, dtype="float32")
    want = _generate(LLM(ckpt, **kw, max_num_seqs=8))
    llm = LLM(ckpt, **kw, max_num_seqs=8, cuda_graphs=True)
    assert _generate(llm) == want
    graphs = llm.runner.graphs
    assert graphs is not None and graphs.stats["decode replays"] >= 10
    check_against_hf(ckpt, llm, _prompts()[:3], 8)
    # Small steps from real graphs too: after prefix hits, and prefills among decodes.
    assert _ask(LLM(ckpt, **kw, cuda_graphs=True)) == _ask(LLM(ckpt, **kw))
    small = dict(max_num_seqs=3, max_num_batched_tokens=16)
    assert _mixed(LLM(ckpt, **kw, **small, cuda_graphs=True)) == _mixed(LLM(ckpt, **kw, **small))


def test_packed_ints_refill_their_views_with_one_copy():
    packed = PackedInts(torch.int32)
    packed.add("a", [1, 2, 3])
    packed.add("b", [-1, -1])
    views = packed.build(torch.device("cpu"))
    assert views["a"].tolist() == [1, 2, 3] and views["b"].tolist() == [-1, -1]
    packed.put("a", [7], fill=0)
    packed.put("b", [5, 6], fill=-1)
    assert views["a"].tolist() == [1, 2, 3]  # the device side changes at upload only
    packed.upload()
    assert views["a"].tolist() == [7, 0, 0] and views["b"].tolist() == [5, 6]
    assert views["b"].data_ptr() == views["a"].data_ptr() + 3 * 4  # one buffer
    with pytest.raises(ValueError, match="'b': 3 values for 2 entries"):
        packed.put("b", [1, 2, 3])
    with pytest.raises(ValueError, match="after build"):
        packed.add("c", [0])


def test_a_host_table_writes_its_rows_as_far_as_the_widest():
    device_table = torch.full((4, 6), 9, dtype=torch.int32)  # 9: an earlier step's ids
    table = HostTable(device_table)
    written = table.fill([[3, 4, 5], [7], []])  # three sequences, one padding row
    assert written.tolist() == [[3, 4, 5], [7, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert device_table.tolist() == [[3, 4, 5, 9, 9, 9], [7, 0, 0, 9, 9, 9],
                                     [0, 0, 0, 9, 9, 9], [0, 0, 0, 9, 9, 9]]  # fmt: skip
    table.fill([[1], [2, 8]])  # narrower: the stale mirror beyond a row is zeroed
    assert device_table[:, :2].tolist() == [[1, 0], [2, 8], [0, 0], [0, 0]]
