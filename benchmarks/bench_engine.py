"""Engine benchmark: hybridkv vs transformers ``generate`` on the same checkpoint, same process.

    .venv/bin/python benchmarks/bench_engine.py [--model DIR] [--dtype D] [--quick] [--write]

Default model: the demo's Gemma 3 270M (``hybridkv[demo]``); ``--random-weights gemma-3-270m``
runs its shape with random weights instead (``random_checkpoint.py``: what a GPU lease
can afford; outputs are then a random model's, and the prompts are token ids drawn from
a seeded generator when the checkpoint has no tokenizer). Three cases:

1. batch throughput: 16 distinct prompts of 256 tokens, 64 new tokens each
   (on a GPU: 64 prompts, 128 new tokens; greedy, EOS ignored): output tokens
   per second, and how many of the outputs are token-identical to transformers';
2. shared document: one 2,048-token document, 8 questions asked one after the
   other: time to first token with prefix hits vs the cold first request, and
   vs transformers (which recomputes the document every time);
3. KV memory held by 8 requests sharing that document (32 new tokens each):
   our blocks in use x page size while all 8 decode (and the peak over the
   run) vs the bytes of transformers' cache after the same batch (left-padded).

``--async-scheduling`` adds a case 4: case 1's batch on the same engine without and with
async scheduling (``engine_async.py``). ``--write`` saves the tables to
``benchmarks/results/engine-<device>.md``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybridkv.engine import LLM, SamplingParams  # noqa: E402
from hybridkv.engine.demo_text import DOCUMENT  # noqa: E402
from hybridkv.models.layers.packed_linear import describe_linears  # noqa: E402

QUESTIONS = [
    f"\nQuestion {i + 1}: {q}\nAnswer:"
    for i, q in enumerate(
        [
            "When was the town founded?",
            "Who founded it?",
            "What came in 1871?",
            "How far does the light reach?",
            "When is the festival?",
            "What is in the bread?",
            "How many people live there?",
            "Who is the mayor?",
        ]
    )
]


def corpus(tokenizer: Any, n: int) -> list[int]:
    """``n`` tokens of English text (the demo document, repeated); without a tokenizer,
    ``n`` ids drawn from a seeded generator (the same ones every run)."""
    if tokenizer is None:
        return torch.randint(3, 20_000, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"]
    return ids[:n]


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text``'s ids; without a tokenizer, one id per character (its code point, offset)."""
    if tokenizer is None:
        return [3 + ord(c) % 20_000 for c in text]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def pad_id(tokenizer: Any) -> int:
    return (getattr(tokenizer, "pad_token_id", None) or 0) if tokenizer is not None else 0


def hf_model(path: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_generate(model: Any, batch: list[list[int]], new: int, pad: int) -> tuple[Any, float]:
    """Left-padded greedy generate on the model's device; returns (output, seconds)."""
    width = max(map(len, batch))
    dev = model.device
    ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch], device=dev)
    mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=dev)
    _sync(dev)
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=pad,
            return_dict_in_generate=True,
        )
    _sync(dev)
    return out, time.perf_counter() - t


def cache_bytes(cache: Any) -> int:
    """Bytes of the key/value tensors transformers' cache holds."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def arguments(doc: str | None, dtype: str, results: str) -> argparse.ArgumentParser:
    """The options the engine benchmarks share: ``--model``, ``--dtype``, ``--write``."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    ap.add_argument(
        "--random-weights",
        default=None,
        metavar="SHAPE",
        help="a model's shape with random weights instead of --model (random_checkpoint.py)",
    )
    ap.add_argument("--dtype", default=dtype, help="float32 | bfloat16 (both engines)")
    ap.add_argument("--write", action="store_true", help=f"write benchmarks/results/{results}")
    ap.add_argument(
        "--kernel-backend",
        default=None,
        help="hybridkv's kernels: native | torch | triton (default: the engine's)",
    )
    ap.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="replay decode steps from CUDA graphs (LLM(cuda_graphs=True))",
    )
    return ap


def resolve_model(args: argparse.Namespace) -> None:
    """``args.model``: ``--model``, else a random-weights checkpoint of ``--random-weights``
    (written once under the hybridkv cache), else the demo checkpoint."""
    if args.model is not None and args.random_weights is not None:
        raise SystemExit("--model and --random-weights exclude each other")
    if args.random_weights is not None:
        from random_checkpoint import write_random_checkpoint

        from hybridkv.common import env

        out = env.cache_root() / f"random-{args.random_weights}"
        args.model = write_random_checkpoint(args.random_weights, out)
    elif args.model is None:
        from hybridkv.models.demo_checkpoint import demo_checkpoint

        args.model = demo_checkpoint()


def model_title(args: argparse.Namespace) -> str:
    """The model as results name it: ``--random-weights`` runs say so."""
    if args.random_weights is not None:
        return f"{args.random_weights} (random weights)"
    return args.model.name


def engine(args: argparse.Namespace, device: str) -> tuple[torch.dtype, LLM]:
    """``args.model`` (default: the demo checkpoint) loaded in ``args.dtype`` on ``device``."""
    resolve_model(args)
    dtype = getattr(torch, args.dtype)
    llm = LLM(
        args.model,
        dtype=dtype,
        device=device,
        max_model_len=4096,
        max_num_batched_tokens=2048,
        kernel_backend=args.kernel_backend,
        cuda_graphs=args.cuda_graphs,
    )
    return dtype, llm


def emit(lines: list[str], name: str, write: bool) -> None:
    """Print a results table; with ``write``, also save it as ``benchmarks/results/<name>``."""
    print("\n".join(lines))
    if write:
        out = ROOT / "benchmarks" / "results" / name
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")


def throughput(llm: LLM, hf: Any, tok: Any, n_prompts: int, length: int, new: int) -> list[str]:
    text = corpus(tok, length + 16 * n_prompts)
    prompts = [text[i * 13 : i * 13 + length] for i in range(n_prompts)]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    # Warm-up at the timed run's shapes (Triton's compiles; with --cuda-graphs, the
    # captures of its decode batch), so that neither is timed.
    llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(max_tokens=2, ignore_eos=True),
        use_tqdm=False,
    )
    hf_generate(hf, prompts[:2], 2, pad_id(tok))  # warm-up (CUDA: kernels, cuBLAS)
    llm.manager.reset_prefix_cache()
    t = time.perf_counter()
    ours = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ours_s = time.perf_counter() - t
    hf_out, hf_s = hf_generate(hf, prompts, new, pad_id(tok))
    same = sum(
        o.outputs[0].token_ids == hf_out.sequences[i, length:].tolist() for i, o in enumerate(ours)
    )
    total = n_prompts * new
    print(
        f"throughput: ours {total / ours_s:.1f} tok/s, transformers {total / hf_s:.1f} tok/s "
        f"({hf_s / ours_s:.2f}x); identical outputs {same}/{n_prompts}",
        flush=True,
    )
    return [f"| {n_prompts} x {length} -> {new} | {total / ours_s:.1f} | {total / hf_s:.1f} | "
            f"{hf_s / ours_s:.2f}x | {same}/{n_prompts} |"]  # fmt: skip


def shared_document(llm: LLM, hf: Any, tok: Any, doc_len: int, n_q: int) -> list[str]:
    doc = corpus(tok, doc_len)
    qs = [encode(tok, q) for q in QUESTIONS[:n_q]]
    one = SamplingParams(max_tokens=1)
    # Warm-up on another document of the same length (no prefix in common): a cold
    # question and a hit, so that compiles and graph captures of these shapes are
    # not timed below.
    other = corpus(tok, doc_len + 64)[64:]
    for q in qs[:2]:
        llm.generate({"prompt_token_ids": other + q}, one, use_tqdm=False)
    llm.manager.reset_prefix_cache()
    cold = llm.generate({"prompt_token_ids": doc + qs[0]}, one, use_tqdm=False)[0]
    cold_s = cold.metrics.time_to_first_token or 0.0
    hits = [llm.generate({"prompt_token_ids": doc + q}, one, use_tqdm=False)[0] for q in qs[1:]]
    hit_s = sum(h.metrics.time_to_first_token or 0.0 for h in hits) / len(hits)
    cached = sum(h.num_cached_tokens for h in hits) / len(hits)
    hf_times = [hf_generate(hf, [doc + q], 1, pad_id(tok))[1] for q in qs[1:3]]
    hf_s = sum(hf_times) / len(hf_times)
    print(
        f"shared doc: cold {cold_s * 1000:.0f} ms, hit {hit_s * 1000:.0f} ms "
        f"({cold_s / hit_s:.1f}x), transformers {hf_s * 1000:.0f} ms ({hf_s / hit_s:.1f}x); "
        f"{cached:.0f} tokens cached per hit",
        flush=True,
    )
    return [
        f"| {doc_len} + ~{len(qs[1])} | {cold_s * 1000:.0f} | {hit_s * 1000:.0f} | "
        f"{cold_s / hit_s:.1f}x | {hf_s * 1000:.0f} | {hf_s / hit_s:.1f}x | {cached:.0f} |"
    ]


def shared_memory(llm: LLM, hf: Any, tok: Any, doc_len: int, n_req: int, new: int) -> list[str]:
    doc = corpus(tok, doc_len)
    prompts = [doc + encode(tok, q) for q in QUESTIONS[:n_req]]
    llm.manager.reset_prefix_cache()
    pool, usable = llm.manager.block_pool, llm.kv_cache_config.num_blocks - 1
    peak, held = [0], [0]
    step = llm.step

    def tracked() -> None:
        step()
        used = round(pool.usage * usable)
        peak[0] = max(peak[0], used)
        running = llm.scheduler.running
        if len(running) == n_req and all(r.num_output_tokens >= 1 for r in running):
            held[0] = max(held[0], used)  # all requests prefilled and decoding

    llm.step = tracked  # type: ignore[method-assign]
    try:
        llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(max_tokens=new, ignore_eos=True),
            use_tqdm=False,
        )
    finally:
        del llm.step
    page = llm.plan.page_bytes
    hf_out, _ = hf_generate(hf, prompts, new, pad_id(tok))
    theirs = cache_bytes(hf_out.past_key_values)
    mib = 2**20
    print(
        f"KV memory of {n_req} requests sharing {doc_len} tokens: ours "
        f"{held[0] * page / mib:.1f} MiB held while all decode ({held[0]} blocks; peak "
        f"{peak[0] * page / mib:.1f} MiB during "
        f"the {llm.max_num_batched_tokens}-token prefill chunk), transformers "
        f"{theirs / mib:.1f} MiB ({held[0] * page / theirs:.3f} of it)",
        flush=True,
    )
    return [
        f"| {n_req} x ({doc_len} + q) -> {new} | {held[0] * page / mib:.1f} | "
        f"{peak[0] * page / mib:.1f} | {theirs / mib:.1f} | {held[0] * page / theirs:.3f} | "
        f"{peak[0] * page / theirs:.3f} |"
    ]


def main() -> int:
    ap = arguments(__doc__, "float32", "engine-*.md")
    ap.add_argument("--quick", action="store_true", help="smaller cases (a smoke run)")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="4. case 1's batch without and with async scheduling")  # fmt: skip
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype, llm = engine(args, device)
    hf = hf_model(args.model, dtype).to(device)
    tok = llm.tokenizer
    if args.quick:
        n, length, new, doc, nq = 4, 64, 8, 256, 3
    elif device == "cuda":  # issue 16: 64 concurrent requests, 256-token prompts, 128 new
        n, length, new, doc, nq = 64, 256, 128, 2048, 8
    else:
        n, length, new, doc, nq = 16, 256, 64, 2048, 8
    rows_t = throughput(llm, hf, tok, n, length, new)
    rows_d = shared_document(llm, hf, tok, doc, nq)
    rows_m = shared_memory(llm, hf, tok, doc, min(8, nq), 32 if not args.quick else 4)
    rows_a = []
    if args.async_scheduling:
        from engine_async import async_rows

        text = corpus(tok, length + 16 * n)
        batch = [text[i * 13 : i * 13 + length] for i in range(n)]  # case 1's prompts
        rows_a = ["", "## 4. Async scheduling: case 1's batch, the same engine", "",
                  "| async scheduling | output tokens/s | decode step (ms, median) |",
                  "| --- | --- | --- |", *async_rows(llm, batch, new)]  # fmt: skip
    if device == "cuda":
        where = torch.cuda.get_device_name()
    else:
        where = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    lines = [f"# Engine benchmark: {model_title(args)}, {args.dtype}, {device}", "",
             f"{where}; torch {torch.__version__}; hybridkv (kernel backend "
             f"`{llm.kernel_backend}`; linear layers: {describe_linears(llm.model)}"
             f"{'; decode steps from CUDA graphs' if args.cuda_graphs else ''}) vs "
             "transformers `generate` in the "
             "same process, same checkpoint and dtype, greedy.", "",
             "## 1. Batch throughput (output tokens/s)", "",
             "| prompts | hybridkv | transformers | speed-up | identical outputs |",
             "| --- | --- | --- | --- | --- |", *rows_t, "",
             "## 2. Shared document: time to first token (ms), questions asked one by one", "",
             "| tokens | hybridkv cold | hybridkv with hits | hit vs cold | transformers | "
             "hit vs transformers | tokens from cache |",
             "| --- | --- | --- | --- | --- | --- | --- |", *rows_d, "",
             "## 3. KV memory of requests sharing the document (MiB)", "",
             "Held: blocks in use while all requests decode (the document's blocks are "
             "shared; sliding-window groups keep only the window). Peak: the most blocks in "
             "use at any step, reached while the first request prefills a "
             "`max_num_batched_tokens` chunk (every token of a chunk needs its slot, even in "
             "sliding-window groups). transformers: the bytes of the cache `generate` returns.",
             "",
             "| requests | hybridkv held | hybridkv peak | transformers cache | held ratio | "
             "peak ratio |",
             "| --- | --- | --- | --- | --- | --- |", *rows_m, *rows_a]  # fmt: skip
    suffix = "-random" if args.random_weights is not None else ""
    suffix += "-graphs" if args.cuda_graphs else ""
    if args.cuda_graphs:
        graphs = llm.runner.graphs
        assert graphs is not None
        lines += ["", f"Decode steps from CUDA graphs: {dict(sorted(graphs.stats.items()))}."]
    emit(lines, f"engine-{device}-{args.dtype}{suffix}.md", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
