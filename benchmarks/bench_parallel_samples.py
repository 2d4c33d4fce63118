"""``n`` samples of one long prompt: the prompt is computed once, so ``n=4`` costs little
more than ``n=1`` for short outputs.

    .venv/bin/python benchmarks/bench_parallel_samples.py [--model DIR] [--dtype D]
        [--prompt-tokens 2048] [--new 8] [--n 4] [--repeats 3] [--write]

Default model: the demo's Gemma 3 270M (as ``bench_engine.py``). One engine, same process:
each repeat times ``generate`` of one prompt with ``n=1`` and with ``n=4`` (sampled,
seeded, EOS ignored), each on a fresh prefix cache (``reset_prefix_cache``), in
alternating order; the table gives the medians and their ratio (target: at most 1.5x),
and the prefix cache's count for the ``n=4`` call (of its 4 lookups, 3 hit the blocks
the first sample computed). ``--write`` saves ``benchmarks/results/parallel-samples.md``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import arguments, corpus, emit, engine, model_title  # noqa: E402
from machine_info import cpu_features, machine  # noqa: E402

from hybridkv.engine import LLM, SamplingParams  # noqa: E402


def timed(llm: LLM, prompt: list[int], n: int, new: int) -> tuple[float, list[int]]:
    """Seconds of one ``generate`` on a fresh prefix cache; ``[lookups, tokens looked
    up, tokens hit]`` of the prefix cache during it."""
    assert llm.reset_prefix_cache()
    llm.manager.make_prefix_cache_stats()
    params = SamplingParams(n=n, max_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
    t = time.perf_counter()
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    assert [len(s.token_ids) for s in out[0].outputs] == [new] * n
    stats = llm.manager.make_prefix_cache_stats()
    assert stats is not None
    return seconds, [stats.requests, stats.queries, stats.hits]


def main() -> None:
    ap = arguments(__doc__, "bfloat16", "parallel-samples.md")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--new", type=int, default=8, help="output tokens per sample")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dtype, llm = engine(args, "cpu")
    tok = llm.tokenizer
    text = corpus(tok, args.prompt_tokens + 64)
    prompt, other = text[: args.prompt_tokens], text[64:]
    for n in (1, args.n):  # warm-up: another prompt, both shapes
        timed(llm, other, n, 2)
    one: list[float] = []
    many: list[float] = []
    stats: list[int] = []
    for r in range(args.repeats):
        order = (1, args.n) if r % 2 == 0 else (args.n, 1)
        for n in order:
            seconds, s = timed(llm, prompt, n, args.new)
            (one if n == 1 else many).append(seconds)
            if n != 1:
                stats = s
        print(f"repeat {r + 1}: n=1 {one[-1]:.2f} s, n={args.n} {many[-1]:.2f} s", flush=True)
    t1, tn = statistics.median(one), statistics.median(many)
    lookups, looked, hit = stats
    lines = [
        f"# n samples of one prompt: {model_title(args)}, {str(dtype).removeprefix('torch.')}, cpu",
        "",
        f"{machine()}; {cpu_features()}; torch threads {__import__('torch').get_num_threads()}; "
        f"kernel backend `{llm.kernel_backend.name}`. `benchmarks/bench_parallel_samples.py`: "
        f"one {args.prompt_tokens}-token prompt, {args.new} sampled tokens per sample (seeded, "
        f"EOS ignored), a fresh prefix cache per call, median of {args.repeats} repeats.",
        "",
        f"| prompt | n=1 (s) | n={args.n} (s) | n={args.n} / n=1 | target | "
        f"prefix lookups / hits (tokens looked up, hit) |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {args.prompt_tokens} -> {args.new} | {t1:.2f} | {tn:.2f} | {tn / t1:.2f}x | "
        f"<= 1.5x | {lookups} lookups, {hit} of {looked} tokens hit |",
        "",
        f"The first sample computes the prompt; the other {args.n - 1} hit its "
        f"{hit // max(1, args.n - 1)} cached tokens and compute the rest of the last block "
        f"and their own tokens.",
    ]
    emit(lines, "parallel-samples.md", args.write)


if __name__ == "__main__":
    main()
