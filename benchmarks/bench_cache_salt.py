"""Tenants with different ``cache_salt`` do not share the prefix cache: time to first token.

    .venv/bin/python benchmarks/bench_cache_salt.py [--model DIR] [--dtype D]
        [--prompt-tokens 2048] [--repeats 3] [--write]

Default model: the demo's Gemma 3 270M (as ``bench_engine.py``). One engine, same process;
per repeat, on a fresh prefix cache, the same prompt is sent by tenant A (cold), tenant
A again (its own hit), tenant B (another salt: no hit, so a cold prefill) and an
unsalted request (no hit either). The table gives each one's median time to first
token and cached tokens: B's TTFT is that of a cold prefill, A's second is a hit's.
A shared box disturbs single timings, so the ratios to A's cold TTFT come from the
medians. ``--write`` saves ``benchmarks/results/cache-salt.md``.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import arguments, corpus, emit, engine, model_title  # noqa: E402
from machine_info import cpu_features, machine  # noqa: E402

from hybridkv.engine import SamplingParams  # noqa: E402

CALLS = (("tenant A, cold", "A"), ("tenant A, again", "A"), ("tenant B", "B"), ("no salt", None))


def main() -> None:
    ap = arguments(__doc__, "bfloat16", "cache-salt.md")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dtype, llm = engine(args, "cpu")
    text = corpus(llm.tokenizer, args.prompt_tokens + 64)
    prompt, other = text[: args.prompt_tokens], text[64:]
    one = SamplingParams(max_tokens=1)
    llm.generate({"prompt_token_ids": other}, one, use_tqdm=False)  # warm-up
    ttft: dict[str, list[float]] = {label: [] for label, _ in CALLS}
    cached: dict[str, int] = {}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        assert llm.reset_prefix_cache()
        for label, salt in CALLS:
            p: dict[str, object] = {"prompt_token_ids": prompt}
            if salt is not None:
                p["cache_salt"] = f"tenant-{salt}"
            out = llm.generate(p, one, use_tqdm=False)[0]
            ttft[label].append(out.metrics.time_to_first_token or 0.0)
            cached[label] = out.num_cached_tokens
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in ttft.items()))
    load.append(os.getloadavg()[0])
    cold = statistics.median(ttft[CALLS[0][0]])
    lines = [
        f"# cache_salt: {model_title(args)}, {str(dtype).removeprefix('torch.')}, cpu",
        "",
        f"{machine()}; {cpu_features()}; kernel backend `{llm.kernel_backend.name}`; load "
        f"average {load[0]:.1f} before, {load[1]:.1f} after. "
        f"`benchmarks/bench_cache_salt.py --repeats {args.repeats}`: one "
        f"{args.prompt_tokens}-token prompt, one output token, a fresh prefix cache per "
        f"repeat; the calls in this order, medians.",
        "",
        "| call | cached tokens | TTFT (s) | vs tenant A cold |",
        "| --- | --- | --- | --- |",
        *(
            f"| {label} | {cached[label]} | {statistics.median(ttft[label]):.2f} | "
            f"{statistics.median(ttft[label]) / cold:.2f}x |"
            for label, _ in CALLS
        ),
    ]
    emit(lines, "cache-salt.md", args.write)


if __name__ == "__main__":
    main()
