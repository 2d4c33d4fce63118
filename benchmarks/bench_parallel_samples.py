"""``n`` samples of one long prompt: the prompt is computed once, so ``n=4`` costs little
more than ``n=1`` for short outputs.

    .venv/bin/python benchmarks/bench_parallel_samples.py [--model DIR] [--dtype D]
        [--prompt-tokens 2048] [--new 8] [--n 4] [--repeats 3] [--write]

Default model: the demo's Gemma 3 270M (as ``bench_engine.py``). One engine, same process:
each repeat times ``generate`` of one prompt with ``n=1`` and with ``n=4`` (sampled,
seeded, EOS ignored), each on a fresh prefix cache (``reset_prefix_cache``), in
alternating order; the table gives the fastest and median wall times, the median CPU
time of the process, and their ratios (target: at most 1.5x), and the prefix cache's
count for the ``n=4`` call (of its 4 lookups, 3 hit the blocks the first sample
computed). On a shared box, the fastest wall time and the CPU time are the figures
least disturbed by other processes. ``--write`` saves ``benchmarks/results/parallel-samples.md``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import arguments, corpus, emit, engine, model_title  # noqa: E402
from machine_info import cpu_features, machine  # noqa: E402

from hybridkv.engine import LLM, SamplingParams  # noqa: E402


def timed(llm: LLM, prompt: list[int], n: int, new: int) -> tuple[float, float, list[int]]:
    """Wall and CPU seconds (this process, all threads) of one ``generate`` on a fresh
    prefix cache; ``[lookups, tokens looked up, tokens hit]`` of the prefix cache."""
    assert llm.reset_prefix_cache()
    llm.manager.make_prefix_cache_stats()
    params = SamplingParams(n=n, max_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
    t, c = time.perf_counter(), time.process_time()
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    seconds, cpu = time.perf_counter() - t, time.process_time() - c
    assert [len(s.token_ids) for s in out[0].outputs] == [new] * n
    stats = llm.manager.make_prefix_cache_stats()
    assert stats is not None
    return seconds, cpu, [stats.requests, stats.queries, stats.hits]


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
    times: dict[int, list[tuple[float, float]]] = {1: [], args.n: []}
    stats: list[int] = []
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        order = (1, args.n) if r % 2 == 0 else (args.n, 1)
        for n in order:
            seconds, cpu, s = timed(llm, prompt, n, args.new)
            times[n].append((seconds, cpu))
            if n != 1:
                stats = s
        print(
            f"repeat {r + 1}: n=1 {times[1][-1][0]:.2f} s, n={args.n} {times[args.n][-1][0]:.2f} s",
            flush=True,
        )
    load.append(os.getloadavg()[0])
    lookups, looked, hit = stats
    rows = []
    for label, pick in (("wall, fastest", min), ("wall, median", statistics.median)):
        t1 = pick(w for w, _ in times[1])
        tn = pick(w for w, _ in times[args.n])
        rows.append((label, t1, tn))
    c1 = statistics.median(c for _, c in times[1])
    cn = statistics.median(c for _, c in times[args.n])
    rows.append(("CPU time (all threads), median", c1, cn))
    lines = [
        f"# n samples of one prompt: {model_title(args)}, {str(dtype).removeprefix('torch.')}, cpu",
        "",
        f"{machine()}; {cpu_features()}; torch threads {torch.get_num_threads()}; "
        f"kernel backend `{llm.kernel_backend.name}`; load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after (a shared box: the fastest wall times and the CPU times are the "
        f"least disturbed). `benchmarks/bench_parallel_samples.py --repeats {args.repeats}`: "
        f"one {args.prompt_tokens}-token prompt, {args.new} sampled tokens per sample "
        f"(seeded, EOS ignored), a fresh prefix cache per call, n=1 and n={args.n} alternating.",
        "",
        f"| prompt | measure | n=1 (s) | n={args.n} (s) | n={args.n} / n=1 | target |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {args.prompt_tokens} -> {args.new} | {label} | {t1:.2f} | {tn:.2f} | "
            f"{tn / t1:.2f}x | <= 1.5x |"
            for label, t1, tn in rows
        ),
        "",
        f"Prefix cache during the n={args.n} call: {lookups} lookups, {hit} of {looked} "
        f"tokens hit. The first sample computes the prompt; the other {args.n - 1} hit its "
        f"{hit // max(1, args.n - 1)} cached tokens and compute the rest of the last block "
        f"and their own tokens.",
    ]
    emit(lines, "parallel-samples.md", args.write)


if __name__ == "__main__":
    main()
