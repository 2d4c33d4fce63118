"""CUDA graphs against the eager engine, every family, in one process.

    .venv/bin/python benchmarks/bench_graphs.py [--families gemma3,jamba] [--write]
        [--dtype float32]  # the GPU's default is bfloat16
    .venv/bin/python benchmarks/bench_graphs.py --tiny     # the CPU check of the code path

Per family, on a random checkpoint of its test layout (``tests/engine/tiny_checkpoints``)
widened to a small real shape (``WIDE``: hidden 512, 8 heads of 64, vocabulary 32,000,
windows of 512; experts 8; Mamba2 16 heads of 64), bf16, the ``triton`` backend, the
same prompts for both engines (eager first, then ``cuda_graphs=True``):

- **decode**: ``N_PROMPTS`` x ``PROMPT`` -> ``NEW`` tokens, tokens per second, and
  how many outputs are identical between the two;
- **shared document**: a ``DOC``-token document, one question cold, then three
  questions on it (prefix hits: each a small step the graphs replay); TTFT of the cold
  prompt and the mean of the hits.

Each engine is warmed up at the timed shapes first (Triton compiles; graph captures).
After the timed runs each engine decodes the same batch once more with its logits
recorded (untimed), and every output where graphs and eager part is explained as
``benchmarks/explain_divergence.py`` explains the demo's: the first differing step, each
engine's margin between its token and the other's, in ulps of the dtype at those
logits (a *near-tie* is within ``TIE_ULPS`` of both), and whether each engine repeats
its own timed outputs. Why they can part in bf16 although the graph tests are
token-identical in fp32: a graphed step computes the same values by other launches.
Its attention is planned for the step's span class (at least 2,048 keys) where the
eager step plans for its longest context (here 129-192 keys): full-attention decodes
then take key tiles of 128 (4 warps) instead of 32 (2 warps), so the online softmax
rescales and sums in another order; and the routed experts (Llama 4, Jamba, Granite)
take their dense form. Both are exact in real arithmetic; their last bits differ, and
where a bf16 rounding flips, a random model's near-flat logits can turn it into
another token (the likely cause; the report tells).
Where no GPU is present the graphs are ``EagerReplay`` (the CPU tests' stand-in) and
``--tiny`` keeps the tests' shapes: that checks the code path, not the speed (no
timing of it is a result). Results: ``benchmarks/results/graphs-<device>.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if not torch.cuda.is_available():  # Triton's CPU interpreter (the tests' way)
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "engine")]

from explain_divergence import TIE_ULPS, Divergence, first_divergence  # noqa: E402
from oracle import record_logits  # noqa: E402
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint  # noqa: E402

from hybridkv.engine import LLM, SamplingParams  # noqa: E402
from hybridkv.engine.graphs import EagerReplay, StepGraphs  # noqa: E402

N_PROMPTS, PROMPT, NEW, DOC, QUESTION = 16, 128, 64, 2048, 16
COMMON_WIDE: dict[str, Any] = dict(
    vocab_size=32_000,
    hidden_size=512,
    intermediate_size=1024,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    initializer_range=0.02,
)
MAMBA2_WIDE = dict(mamba_n_heads=16, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=64)
#: Per family: the overrides of its tiny config (the layout stays the tests').
WIDE: dict[str, dict[str, Any]] = {
    "gemma3": dict(COMMON_WIDE, sliding_window=512, query_pre_attn_scalar=64),
    "ministral": dict(COMMON_WIDE, sliding_window=512),
    "cohere2": dict(COMMON_WIDE, sliding_window=512),
    "llama4": dict(
        COMMON_WIDE,
        intermediate_size_mlp=1024,
        attention_chunk_size=8192,
        num_local_experts=8,
        num_experts_per_tok=1,
        floor_scale=8192,
    ),
    "jamba": {
        **{k: v for k, v in COMMON_WIDE.items() if k != "head_dim"},
        "num_experts": 8,
        "num_experts_per_tok": 2,
    },
    "bamba": {**{k: v for k, v in COMMON_WIDE.items() if k != "head_dim"}, **MAMBA2_WIDE},
    "granite": {
        **{k: v for k, v in COMMON_WIDE.items() if k != "head_dim"},
        **MAMBA2_WIDE,
        "intermediate_size": 512,
        "shared_intermediate_size": 1024,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
}
TINY = dict(n_prompts=3, prompt=12, new=4, doc=100, question=4)
FULL = dict(n_prompts=N_PROMPTS, prompt=PROMPT, new=NEW, doc=DOC, question=QUESTION)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _engine(path: Path, graphs: bool, device: str, dtype: torch.dtype, max_seqs: int) -> LLM:
    kw: dict[str, Any] = dict(
        dtype=dtype, device=device, kernel_backend="triton",
        max_num_seqs=max_seqs, kv_cache_memory_bytes=1 << (30 if device == "cuda" else 26),
    )  # fmt: skip
    if device == "cuda":
        return LLM(path, **kw, cuda_graphs=graphs)
    llm = LLM(path, **kw, block_size=4)
    if graphs:  # the CPU stand-in: same code path, no launch savings
        llm.runner.graphs = StepGraphs(
            llm.runner, max_seqs, llm.max_model_len, graph_factory=EagerReplay
        )
    return llm


def _tokens(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def _decode_batch(sizes: dict[str, int], vocab: int) -> list[dict[str, list[int]]]:
    n = sizes["n_prompts"]
    return [{"prompt_token_ids": _tokens(sizes["prompt"], 100 + i, vocab)} for i in range(n)]


def decode(llm: LLM, sizes: dict[str, int], vocab: int) -> tuple[float, list[list[int]]]:
    """Tokens per second of the decode run, and its outputs."""
    batch = _decode_batch(sizes, vocab)
    llm.generate(batch, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)  # warm
    llm.manager.reset_prefix_cache()
    _sync()
    t = time.perf_counter()
    params = SamplingParams(max_tokens=sizes["new"], ignore_eos=True)
    outs = llm.generate(batch, params, use_tqdm=False)
    _sync()
    seconds = time.perf_counter() - t
    return len(batch) * sizes["new"] / seconds, [list(o.outputs[0].token_ids) for o in outs]


def recorded_decode(
    llm: LLM, sizes: dict[str, int], vocab: int
) -> list[tuple[list[int], torch.Tensor]]:
    """The decode run again, untimed (last: the recording stays on ``llm``), with each
    output's per-step logits ``[new, V]`` in the model's dtype."""
    llm.manager.reset_prefix_cache()
    seen = record_logits(llm)
    params = SamplingParams(max_tokens=sizes["new"], ignore_eos=True)
    outs = llm.generate(_decode_batch(sizes, vocab), params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), torch.stack(seen[o.request_id])) for o in outs]


def parting(
    eager: list[tuple[list[int], torch.Tensor]],
    graphs: list[tuple[list[int], torch.Tensor]],
    dtype: torch.dtype,
) -> list[tuple[int, Divergence]]:
    """``(output index, where it parts)`` of every output the two runs differ on
    (``explain_divergence.first_divergence``: eager as "ours", graphs as "theirs")."""
    out = []
    for i, ((a, la), (b, lb)) in enumerate(zip(eager, graphs, strict=True)):
        d = first_divergence(a, la, b, lb, dtype)
        if d.step is not None:
            out.append((i, d))
    return out


def parting_rows(name: str, parts: list[tuple[int, Divergence]]) -> list[str]:
    """The detail table's rows of one family."""
    return [
        f"| {name} | {i} | {d.step} | {d.ours} / {d.theirs} | {d.our_margin:.4g} / "
        f"{d.their_margin:.4g} | {d.ulp:.3g} | {max(d.our_margin, d.their_margin) / d.ulp:.1f} "
        f"| {'near-tie' if d.explained else 'NOT a near-tie'} |"
        for i, d in parts
    ]


def shared_document(llm: LLM, sizes: dict[str, int], vocab: int) -> tuple[float, float, float]:
    """(cold TTFT s, mean hit TTFT s, mean cached tokens per hit)."""
    one = SamplingParams(max_tokens=1)
    questions = [_tokens(sizes["question"], 200 + i, vocab) for i in range(4)]
    other = _tokens(sizes["doc"], 7, vocab)
    for q in questions[:2]:  # warm-up on another document: compiles and captures
        llm.generate({"prompt_token_ids": other + q}, one, use_tqdm=False)
    llm.manager.reset_prefix_cache()
    doc = _tokens(sizes["doc"], 8, vocab)
    cold = llm.generate({"prompt_token_ids": doc + questions[0]}, one, use_tqdm=False)[0]
    hits = [
        llm.generate({"prompt_token_ids": doc + q}, one, use_tqdm=False)[0] for q in questions[1:]
    ]
    hit_s = sum(h.metrics.time_to_first_token or 0.0 for h in hits) / len(hits)
    cached = sum(h.num_cached_tokens for h in hits) / len(hits)
    return cold.metrics.time_to_first_token or 0.0, hit_s, cached


def measure(
    name: str, path: Path, vocab: int, device: str, sizes: dict[str, int], dtype: torch.dtype
) -> tuple[str, str, list[str]]:
    """One family, eager then graphs in this process: its row of the main table, of the
    parting summary, and the parting details."""
    seen: dict[bool, Any] = {}
    for graphs in (False, True):
        llm = _engine(path, graphs, device, dtype, sizes["n_prompts"])
        rate, outs = decode(llm, sizes, vocab)
        cold, hit, cached = shared_document(llm, sizes, vocab)
        stats = dict(llm.runner.graphs.stats) if llm.runner.graphs is not None else {}
        recorded = recorded_decode(llm, sizes, vocab)
        repeats = sum(o == r[0] for o, r in zip(outs, recorded, strict=True))
        seen[graphs] = (rate, outs, cold, hit, cached, stats, recorded, repeats)
        print(f"{name} graphs={graphs}: {rate:.1f} tok/s, TTFT cold {cold * 1e3:.1f} ms, "
              f"hit {hit * 1e3:.1f} ms ({cached:.0f} cached); {stats}; recorded run repeats "
              f"{repeats}/{len(outs)} timed outputs", flush=True)  # fmt: skip
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    (r0, o0, c0, h0, _, _, rec0, rep0) = seen[False]
    (r1, o1, c1, h1, cached, stats, rec1, rep1) = seen[True]
    same = sum(a == b for a, b in zip(o0, o1, strict=True))
    replays = stats.get("decode replays", 0) + stats.get("small-step replays", 0)
    eager = sum(v for k, v in stats.items() if k.startswith("eager"))
    row = (
        f"| {name} | {r0:.0f} | {r1:.0f} | {r1 / r0:.2f}x | {same}/{len(o0)} | "
        f"{c0 * 1e3:.1f} / {h0 * 1e3:.1f} | {c1 * 1e3:.1f} / {h1 * 1e3:.1f} | "
        f"{h0 / h1:.2f}x | {c1 / h1:.1f}x | {cached:.0f} | {replays} / {eager} |"
    )
    parts = parting(rec0, rec1, dtype)
    ties = sum(d.explained for _, d in parts)
    steps = sorted(d.step for _, d in parts if d.step is not None)
    widest = max((max(d.our_margin, d.their_margin) / d.ulp for _, d in parts), default=0.0)
    summary = (
        f"| {name} | {len(parts)}/{len(rec0)} | "
        f"{', '.join(map(str, steps)) if steps else '-'} | {ties}/{len(parts)} | "
        f"{widest:.1f} | {rep0}/{len(o0)} | {rep1}/{len(o1)} |"
    )
    return row, summary, parting_rows(name, parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(WIDE), help="comma-separated")
    ap.add_argument("--tiny", action="store_true", help="the tests' shapes (CPU check)")
    ap.add_argument("--dtype", default=None, help="bfloat16 (GPU default) or float32 (CPU default)")
    ap.add_argument("--write", action="store_true", help="benchmarks/results/graphs-<device>.md")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    short = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[dtype]
    sizes = TINY if args.tiny else FULL
    label = torch.cuda.get_device_name() if device == "cuda" else "CPU (EagerReplay: no timing)"
    s = sizes
    lines = [
        f"# CUDA graphs against the eager engine ({label}, {short}, triton backend, "
        "random weights)",
        "",
        f"Decode: {s['n_prompts']} x {s['prompt']} -> {s['new']}. Shared document: "
        f"{s['doc']} tokens + {s['question']}, TTFT cold / mean of 3 hits. "
        "`benchmarks/bench_graphs.py`.",
        "",
        "| family | eager tok/s | graphs tok/s | ratio | same outputs | eager TTFT cold / hit "
        "ms | graphs TTFT cold / hit ms | hit: eager / graphs | graphs: cold / hit | "
        "cached per hit | replays / eager steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summaries, details = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families.split(","):
            config = FAMILY_CONFIGS[name](**({} if args.tiny else WIDE[name]))
            path = save_checkpoint(config, Path(tmp) / name)
            row, summary, rows = measure(name, path, config.vocab_size, device, sizes, dtype)
            lines.append(row)
            summaries.append(summary)
            details += rows
    lines += [
        "",
        "## Where graphed and eager outputs part",
        "",
        "The decode batch once more per engine, untimed, logits recorded. Per output "
        "that differs: the first differing step (both engines saw the same tokens up to "
        "it) and each engine's margin between its token and the other's; a near-tie is "
        f"within {TIE_ULPS} ulps of {short} at those logits for both "
        "(`benchmarks/explain_divergence.py`). *Repeats*: outputs of the recorded run equal "
        "to the same engine's timed run.",
        "",
        "| family | outputs that part | first differing steps | near-ties | widest margin "
        "(ulps) | eager repeats | graphs repeat |",
        "|---|---|---|---|---|---|---|",
        *summaries,
    ]
    if details:
        lines += [
            "",
            "| family | output | step | tokens eager / graphs | margins eager / graphs | "
            "ulp | margin / ulp | |",
            "|---|---|---|---|---|---|---|---|",
            *details,
        ]
    print("\n".join(lines))
    if args.write:
        tag = label.lower().replace(" ", "-") if device == "cuda" else "cpu"
        tag += "" if dtype == torch.bfloat16 or device == "cpu" else f"-{short}"
        out = ROOT / "benchmarks" / "results" / f"graphs-{tag}.md"
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
