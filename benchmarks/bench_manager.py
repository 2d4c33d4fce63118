#!/usr/bin/env python3
"""hybridkv's KVCacheManager vs vLLM v1's, side by side in one process.

Workload (the core issue's): 2,000 requests, each one of 8 shared 1,024-token
prefixes plus a 256-token unique suffix, 32 running at once, 32 decode tokens
each; block size 16; 4,096 blocks; configs ``full`` (one group) and ``hybrid``
(one full + two sliding-window groups, window 128); sha256 block hashing.
The replay loop is the shared harness (``../shared/bench/vllm_baseline``),
which runs vLLM 0.33's real manager from source without installing vLLM.
Ours runs under each cache policy (``--policy lru,hybrid``, the default)
against the same vLLM runs. Runs alternate (vLLM, ours lru, ours hybrid, then
reversed, ...) so machine drift hits all alike; the table shows medians (and
the fastest run per request) and the ratios ours / vLLM. ``lru`` must make vLLM's
decisions block for block: the harness's fingerprint covers every request's hit
tokens and the block ids of every prefill; a differing fingerprint in ``full`` or
``hybrid`` fails the run (exit status 1, after the table). ``hybrid_mamba`` differs
by design (``MAMBA_NOTE``), and ``hybrid`` keeps other blocks, so for those only the
hit rate is shown.
The box may be shared: a run whose machine-speed probe (before or after it)
reads over ``NOISY``x the quietest probe so far is run again, up to
``--retries`` times.

    # once: bash ../shared/bench/vllm_baseline/setup.sh
    ~/.cache/hybridkv-vllm-baseline/venv/bin/python benchmarks/bench_manager.py --write
    python benchmarks/bench_manager.py --no-vllm        # ours only
    python benchmarks/bench_manager.py --policy hybrid  # one policy

Without the baseline (``--no-vllm`` or not set up) only our figures print.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from hybridkv_adapter import HybridkvAdapter, make_config  # noqa: E402
from machine_info import cpu_features, machine  # noqa: E402

from hybridkv import BlockHasher, Request  # noqa: E402

DEFAULT_HARNESS = ROOT.parent / "shared" / "bench" / "vllm_baseline"
DEFAULT_VLLM_SRC = Path.home() / ".cache" / "hybridkv-vllm-baseline" / "src" / "vllm-0.33.0"
perf = time.perf_counter

MAMBA_NOTE = (
    "Different hit decisions are expected here: vLLM's align mode keeps a Mamba state "
    "only where a prefill chunk ended (each prompt is one chunk, so never at the "
    "shared-prefix boundary: 0 % hits); hybridkv under `lru` checkpoints the state at "
    "every block boundary a step crosses, under `hybrid` at the boundaries of each "
    "request's last 512 tokens (and its kept points), so the 1,024-token prefixes hit."
)
HYBRID_NOTE = (
    "Only `lru` is held to vLLM's decisions, hit tokens and block ids (fingerprint): "
    "`hybrid` keeps only what a later hit can use, so its decisions may differ; its hit "
    "rate is shown."
)
POLICIES = ("lru", "hybrid")
#: Configs where ``lru`` must give vLLM's fingerprint (``hybrid_mamba``: ``MAMBA_NOTE``).
SAME_AS_VLLM = ("full", "hybrid")
#: A run is noisy when a probe reads over this times the quietest one so far.
NOISY = 1.25

#: (label, result key, aggregate over the runs). The fastest run is the one the
#: other processes of a shared box disturbed least.
ROWS: list[tuple[str, str, Callable[[list[float]], float]]] = [
    ("per request (us)", "us_per_request", statistics.median),
    ("per request, fastest run (us)", "us_per_request", min),
    ("per allocate_slots (us)", "us_per_allocate_slots", statistics.median),
    ("  prefill allocate_slots (us)", "us_per_allocate_slots_prefill", statistics.median),
    ("  decode allocate_slots (us)", "us_per_allocate_slots_decode", statistics.median),
    ("get_computed_blocks (us)", "us_per_get_computed_blocks", statistics.median),
    (
        "Request() + prompt hashing (us)",
        "us_per_request_create_incl_prompt_hash",
        statistics.median,
    ),
    ("append_output_token (us)", "us_per_append_output_token", statistics.median),
    ("free (us)", "us_per_free", statistics.median),
]


def load_harness(path: Path) -> ModuleType:
    sys.path.insert(0, str(path))
    import bench_vllm

    return bench_vllm


def hash_ns_per_token(
    harness: ModuleType | None, with_vllm: bool, prompt_len: int, iters: int, block_size: int
) -> dict[str, dict[str, float]]:
    """Median ns/token to hash a fresh ``prompt_len``-token prompt, interleaved."""
    rng = random.Random(7)
    prompt = [rng.randrange(32000) for _ in range(prompt_len)]
    algos = ["sha256", "xxhash"]
    times: dict[str, list[float]] = {}
    if with_vllm and harness is not None:
        g = vars(harness)
        vreq = g["Request"](
            request_id="h",
            prompt_token_ids=prompt,
            sampling_params=g["SamplingParams"](max_tokens=1),
            pooling_params=None,
            block_hasher=None,
        )
        fns = {a: g["hashing"].get_hash_fn_by_name(a) for a in algos}
        hashers = {a: g["get_request_block_hasher"](block_size, fns[a]) for a in algos}
    for _ in range(iters):
        for algo in algos:
            if with_vllm and harness is not None:
                g["init_none_hash"](fns[algo])
                vreq.block_hashes = []
                gc.collect()
                t0 = perf()
                hashers[algo](vreq)
                times.setdefault(f"vllm:{algo}", []).append(perf() - t0)
            ours = BlockHasher(block_size, algo)
            req = Request("h", prompt)
            gc.collect()
            t0 = perf()
            req.bind_hasher(ours)
            times.setdefault(f"hybridkv:{algo}", []).append(perf() - t0)
            assert len(req.live_block_hashes) == prompt_len // block_size
    return {k: {"ns_per_token": statistics.median(v) / prompt_len * 1e9} for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--configs",
        nargs="+",
        default=["full", "hybrid"],
        choices=["full", "hybrid", "hybrid_mamba"],
    )
    p.add_argument(
        "--policy",
        type=policies,
        default=list(POLICIES),
        help="our cache policies, comma-separated (default: lru,hybrid)",
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per config")
    p.add_argument("--retries", type=int, default=3, help="reruns of a noisy run (see NOISY)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--hash-prompt-len", type=int, default=50000)
    p.add_argument("--hash-iters", type=int, default=7)
    p.add_argument(
        "--harness",
        type=Path,
        default=Path(os.environ.get("HYBRIDKV_VLLM_HARNESS", DEFAULT_HARNESS)),
    )
    p.add_argument(
        "--vllm-src", type=Path, default=Path(os.environ.get("VLLM_SRC", DEFAULT_VLLM_SRC))
    )
    p.add_argument("--no-vllm", action="store_true", help="time hybridkv only")
    p.add_argument("--write", action="store_true", help="write benchmarks/results/manager.md")
    args = p.parse_args()

    if not (args.harness / "bench_vllm.py").exists():
        sys.exit(f"replay harness not found at {args.harness} (set --harness)")
    harness = load_harness(args.harness)
    with_vllm = not args.no_vllm
    env = None
    if with_vllm:
        if not args.vllm_src.exists():
            sys.exit(
                f"vLLM source not found at {args.vllm_src}: run "
                f"`bash {args.harness}/setup.sh` (and use its venv), or pass --no-vllm"
            )
        env = harness.import_vllm(False, str(args.vllm_src))
        import logging

        logging.getLogger("vllm").setLevel(logging.ERROR)
    # The harness's default --fingerprint-blocks: hit tokens and block ids.
    a = harness.parse_args(["--requests", str(args.requests)])
    workload = harness.make_workload(a)
    print(f"machine: {machine()} ({cpu_features()})")
    if env:
        print(
            f"baseline: vLLM {env['vllm_version']} ({env['import_recipe']}), torch {env['torch']}"
        )

    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    quietest = [float("inf")]
    ours = [f"hybridkv:{policy}" for policy in args.policy]
    for kind in args.configs:
        order = ["vllm", *ours] if with_vllm else ours
        runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in order}
        for r in range(args.rounds):
            for impl in order if r % 2 == 0 else order[::-1]:
                for attempt in range(args.retries + 1):
                    res = timed_replay(harness, kind, impl, a, workload)
                    noisy = max(res["calib_ms"]) > NOISY * quietest[0]
                    quietest[0] = min(quietest[0], *res["calib_ms"])
                    print(
                        f"  [{kind}] round {r + 1} {impl:15s} {res['us_per_request']:8.1f} "
                        f"us/request hit {res['prefix_hit_rate'] * 100:.2f}% "
                        f"fp {res['fingerprint']} calib {res['calib_ms'][0]:.1f}/"
                        f"{res['calib_ms'][1]:.1f} ms{' (noisy)' if noisy else ''}",
                        flush=True,
                    )
                    if not noisy or attempt == args.retries:
                        break
                runs[impl].append(res)
        results[kind] = runs
    hashing = hash_ns_per_token(
        harness, with_vllm, args.hash_prompt_len, args.hash_iters, a.block_size
    )
    report = render(results, hashing, with_vllm, env, args)
    print()
    print(report)
    if args.write:
        out = ROOT / "benchmarks" / "results" / "manager.md"
        out.write_text(report)
        print(f"wrote {out}")
    differ = [kind for kind in SAME_AS_VLLM if kind in results and not same_as_vllm(results[kind])]
    if differ:
        sys.exit(f"lru's decisions differ from vLLM's (hit tokens or block ids) in: {differ}")


def same_as_vllm(runs: dict[str, list[dict[str, Any]]]) -> bool:
    """``lru``'s runs have vLLM's fingerprint (True when either was not run)."""
    if "vllm" not in runs or "hybridkv:lru" not in runs:
        return True
    return {r["fingerprint"] for r in runs["vllm"]} == {
        r["fingerprint"] for r in runs["hybridkv:lru"]
    }


def timed_replay(
    harness: ModuleType, kind: str, impl: str, a: argparse.Namespace, workload: Any
) -> dict[str, Any]:
    """One replay of ``workload`` by ``impl`` (``vllm`` or ``hybridkv:POLICY``),
    with the machine-speed probe before and after it."""
    if impl == "vllm":
        adapter: Any = harness.VllmAdapter(
            harness.make_config(kind, a.block_size, a.num_blocks, a.window), a
        )
    else:
        adapter = HybridkvAdapter(
            make_config(kind, a.block_size, a.num_blocks, a.window),
            a,
            cache_policy=impl.split(":", 1)[1],
        )
    c0 = harness.calib_ms()
    res: dict[str, Any] = harness.replay(adapter, workload, a)
    res["calib_ms"] = [c0, harness.calib_ms()]
    return res


def policies(text: str) -> list[str]:
    """``--policy``: comma-separated cache policies, each once."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"--policy takes distinct names from {', '.join(POLICIES)}, comma-separated; "
            f"got {text!r}"
        )
    return names


def hit_rate(runs: list[dict[str, Any]]) -> str:
    return f"{runs[0]['prefix_hit_rate'] * 100:.2f} %"


def render(
    results: dict[str, Any],
    hashing: dict[str, Any],
    with_vllm: bool,
    env: dict[str, Any] | None,
    args: argparse.Namespace,
) -> str:
    lines = [
        "# KVCacheManager benchmark: hybridkv vs vLLM v1",
        "",
        f"Machine: {machine()} ({cpu_features()}). Generated by `benchmarks/bench_manager.py` on "
        f"{time.strftime('%Y-%m-%d')}.",
    ]
    if env:
        lines.append(
            f"Baseline: vLLM {env['vllm_version']}'s real `KVCacheManager` "
            f"({env['import_recipe']}), same process, alternating runs, "
            f"medians of {args.rounds} runs each."
        )
    lines += [
        "",
        f"Workload: {args.requests} requests = one of 8 shared 1,024-token prefixes + a "
        "256-token unique suffix, 32 running, 32 decode tokens each, block size 16, "
        "4,096 blocks, sha256 block hashes. `hybrid` = 1 full + 2 sliding-window groups "
        "(window 128).",
        "",
    ]
    for kind, runs in results.items():
        ours = {impl.split(":", 1)[1]: r for impl, r in runs.items() if impl != "vllm"}
        lines.append(f"## `{kind}`")
        lines.append("")
        head = [f"hybridkv `{policy}`" for policy in ours]
        if with_vllm:
            v = runs["vllm"]
            lines += [
                "| | vLLM | " + " | ".join(f"{h} | ratio" for h in head) + " |",
                "| --- | ---: |" + " ---: | ---: |" * len(ours),
            ]
            for label, key, agg in ROWS:
                a = agg([r[key] for r in v])
                cells = [
                    f"{agg([r[key] for r in o]):.2f} | {agg([r[key] for r in o]) / a:.2f}x"
                    for o in ours.values()
                ]
                lines.append(f"| {label.strip()} | {a:.2f} | " + " | ".join(cells) + " |")
            cells = [f"{hit_rate(o)} |" for o in ours.values()]
            lines.append(f"| prefix hit rate | {hit_rate(v)} | " + " | ".join(cells) + " |")
            cells = []
            same = "yes" if same_as_vllm(runs) else "NO"
            if same == "NO" and kind not in SAME_AS_VLLM:
                same = "no (by design, below)"
            for policy in ours:
                cells.append(f"{same} |" if policy == "lru" else "not compared |")
            lines.append(
                "| same decisions: hits and block ids (fingerprint) | | " + " | ".join(cells) + " |"
            )
        else:
            lines += ["| | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(ours)]
            for label, key, agg in ROWS:
                cells = [f"{agg([r[key] for r in o]):.2f}" for o in ours.values()]
                lines.append(f"| {label.strip()} | " + " | ".join(cells) + " |")
            cells = [hit_rate(o) for o in ours.values()]
            lines.append("| prefix hit rate | " + " | ".join(cells) + " |")
        if with_vllm and "hybrid" in ours:
            lines += ["", HYBRID_NOTE]
        if kind == "hybrid_mamba":
            lines += ["", MAMBA_NOTE]
        calib = [c for rs in runs.values() for r in rs for c in r["calib_ms"]]
        lines += [
            "",
            f"Machine-speed probe (fixed loop) of the runs kept: "
            f"{min(calib):.1f}-{max(calib):.1f} ms (runs over {NOISY}x the quietest probe "
            f"were run again, up to {args.retries} times).",
            "",
        ]
    lines += [f"## Block hashing, {args.hash_prompt_len:,}-token prompt (ns/token, median)", ""]
    if with_vllm:
        lines += ["| algorithm | vLLM | hybridkv | ratio |", "| --- | ---: | ---: | ---: |"]
        for algo in ("sha256", "xxhash"):
            v = hashing[f"vllm:{algo}"]["ns_per_token"]
            o = hashing[f"hybridkv:{algo}"]["ns_per_token"]
            lines.append(f"| {algo} | {v:.1f} | {o:.1f} | {o / v:.2f}x |")
        v256 = hashing["vllm:sha256"]["ns_per_token"]
        lines.append(
            f"| hybridkv xxhash vs vLLM sha256 | | | "
            f"{hashing['hybridkv:xxhash']['ns_per_token'] / v256:.2f}x |"
        )
    else:
        lines += ["| algorithm | hybridkv |", "| --- | ---: |"]
        for algo in ("sha256", "xxhash"):
            lines.append(f"| {algo} | {hashing[f'hybridkv:{algo}']['ns_per_token']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
