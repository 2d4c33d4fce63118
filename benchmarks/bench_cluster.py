"""hybridkv replicas behind sglang-router: ``cache_aware`` against ``round_robin``,
each with and without a Mooncake Store that the replicas share.

Starts ``--replicas`` ``hybridkv serve`` processes of one small random Gemma 3
checkpoint (word-level tokenizer, so text maps to tokens one to one) and the
``sglang-router`` gateway in front of them, all on 127.0.0.1, once per
policy with cold caches. The workload is multi-turn conversations
(``cluster_workload.py``): those of ``--trace`` (default: the Mooncake
conversation trace at ``../shared/traces/mooncake_conversation.jsonl`` where
it is present, else a small generated workload of the same shape), scaled
down: each 512-token hash id becomes ``--words`` words, so turns share exactly
the prefixes the trace says. ``--concurrency`` clients each play whole
conversations, turn after turn, through the OpenAI client (streamed, so TTFT
is the first chunk).

With ``--store both`` (the default) each policy runs twice: alone, and with
every replica on one ``mooncake_master`` (``--kv-store``, a fresh master per
run, each replica lending ``--segment-mb`` to the pool), so that a turn can hit
a prefix another replica computed. ``--store off`` runs the two policies only.

Reports the cluster-wide cached-token fraction (prefix-cache hits over
queries, summed from every replica's ``/metrics``), TTFT p50/p99 and
throughput, with the machine's CPU and vector units, and the workload's ceiling
(``prefix_ceiling``: what one cache holding every prompt would cache). Targets (issue 19):
``cache_aware`` reaches at least 2x the cached-token fraction of
``round_robin`` and at least 1.3x lower TTFT p50; (issue 46) with the store,
``round_robin`` reaches at least 90 % of ``cache_aware``'s fraction without it,
and ``cache_aware`` at least 1.2x its own fraction without it.

``--startup CHECKPOINT`` instead starts ``--replicas`` plain ``hybridkv serve
CHECKPOINT`` processes (no gateway, the server's default options) and reports
how long they take to answer ``/health`` and each one's resident memory
(docs/cluster.md's figures).

It needs the ``cluster`` extra (sglang-router, openai) and says so in one line
when something is missing. Every process it starts is stopped in a
``finally``; loops are bounded in count and time.

    python benchmarks/bench_cluster.py                 # prints the table
    python benchmarks/bench_cluster.py --write         # and results/cluster.md
    python benchmarks/bench_cluster.py --kv-cache-mb 4 --max-model-len 512 \
        --max-blocks 60 --conversations 90 --concurrency 12   # past one replica's cache
    python benchmarks/bench_cluster.py --startup ~/.cache/hybridkv/gemma-3-270m-q4_k_m
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from cluster_procs import MODEL, Cluster, missing_requirements  # noqa: E402
from cluster_report import render  # noqa: E402
from cluster_workload import (  # noqa: E402
    as_text,
    generated_conversations,
    play,
    prefix_ceiling,
    trace_conversations,
)
from machine_info import cpu_features, machine  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
EXTRA = "pip install 'hybridkv[cluster]'"


def checkpoint(path: Path) -> Path:
    """A random Gemma 3 (5 sliding + 1 full layer) whose prefill costs ~1 ms/token here."""
    sys.path.insert(0, str(ROOT / "tests"))  # tiny_checkpoints imports hf_configs
    sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

    cfg = gemma3_config(
        hidden_size=384,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        sliding_window=128,
        max_position_embeddings=1024,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        query_pre_attn_scalar=64,
    )
    return save_word_tokenizer(save_checkpoint(cfg, path))


def fail(message: str) -> None:
    """One line on stderr, exit status 2."""
    print(f"bench_cluster.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def workload(args: argparse.Namespace) -> tuple[list[list[str]], str, float]:
    """The conversations as text, where they came from (for the report), and the
    cached fraction one cache holding everything would give (``prefix_ceiling``)."""
    if args.trace is None:
        convs = generated_conversations(args.conversations, args.min_turns, args.max_turns)
        where = f"a generated conversation workload ({TRACE} is absent; --trace FILE to use one)"
    else:
        if not args.trace.is_file():
            fail(f"--trace {args.trace}: no such file (a Mooncake-format JSONL trace)")
        convs = trace_conversations(
            args.trace, args.conversations, args.min_turns, args.max_turns, args.max_blocks
        )
        if not convs:
            fail(f"--trace {args.trace}: no conversation with {args.min_turns}+ turns")
        where = f"the first {len(convs)} conversations of `{args.trace.name}`"
    return as_text(convs, args.words), where, prefix_ceiling(convs)


def startup(args: argparse.Namespace) -> None:
    """``--startup``: replicas of a checkpoint with the server's defaults; time and RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(args.startup, args.replicas, None, Path(tmp), [])
        try:
            rss = cluster.rss_mib()
        finally:
            cluster.stop()
    print(f"Machine: {machine()}; {cpu_features()}")
    print(
        f"{args.replicas} replicas of {args.startup} (OMP_NUM_THREADS=1 each) answered /health "
        f"{cluster.ready_s:.1f} s after the first started; RSS per replica: "
        + ", ".join(f"{r:,.0f} MiB" for r in rss)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument(
        "--trace",
        type=Path,
        default=TRACE if TRACE.is_file() else None,
        help="a Mooncake-format conversation trace (default: the shared one where present, "
        "else a generated workload)",
    )
    ap.add_argument("--conversations", type=int, default=45)
    ap.add_argument("--min-turns", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--words", type=int, default=8, help="words per 512-token hash id")
    ap.add_argument("--max-blocks", type=int, default=120, help="skip longer trace requests")
    ap.add_argument("--concurrency", type=int, default=9)
    ap.add_argument(
        "--max-model-len",
        type=int,
        default=1024,
        help="each replica's (the KV cache must hold one such request: lower it with "
        "--max-blocks to size a smaller --kv-cache-mb)",
    )
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--cache-policy",
        choices=("lru", "hybrid"),
        default="lru",
        help="each replica's cache policy (what reaches the store, and when: docs/tiers.md)",
    )
    ap.add_argument("--think-ms", type=float, default=0, help="a client's pause between turns")
    ap.add_argument(
        "--kv-cache-mb",
        type=float,
        default=8,
        help="KV cache per replica (MB): a share of the working set",
    )
    ap.add_argument(
        "--startup",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="only start --replicas servers of CHECKPOINT: start-up time and RSS",
    )
    ap.add_argument(
        "--store",
        choices=("both", "off"),
        default="both",
        help="run each policy with and without a shared Mooncake Store (both), or without",
    )
    ap.add_argument("--segment-mb", type=int, default=64, help="store segment per replica (MB)")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/cluster.md")
    args = ap.parse_args()
    missing = missing_requirements()
    if missing:
        fail(f"needs {', '.join(missing)}: {EXTRA}")
    if args.startup is not None:
        if not args.startup.exists():
            fail(f"--startup {args.startup}: no such checkpoint")
        startup(args)
        return
    convs, where, ceiling = workload(args)
    n_req = sum(len(c) for c in convs)
    print(f"{len(convs)} conversations, {n_req} requests, from {where}", flush=True)
    print(f"ceiling (one cache holding everything): {ceiling:.1%} of prompt blocks", flush=True)
    results: dict[str, dict[str, Any]] = {}
    longest = max(len(t.split()) for c in convs for t in c) + 1 + args.max_tokens  # + BOS
    if longest > args.max_model_len:
        fail(
            f"--max-model-len {args.max_model_len} is below the longest request ({longest} "
            "tokens): raise it or lower --max-blocks"
        )
    options = ["--max-model-len", str(args.max_model_len), "--max-num-seqs", "8"]
    options += ["--cache-policy", args.cache_policy]
    options += ["--kv-cache-memory-bytes", str(int(args.kv_cache_mb * 2**20))]
    runs = [(p, False) for p in POLICIES]
    if args.store == "both":
        runs += [(p, True) for p in POLICIES]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "ckpt")
        logs = Path(tmp)
        for policy, store in runs:
            name = policy + ("+store" if store else "")
            results[name] = run(ckpt, policy, store, logs, options, convs, args)
            r = results[name]
            print(
                f"{name}: cached {r['cached']:.1%}, TTFT p50 {r['ttft_p50'] * 1e3:.0f} ms, "
                f"p99 {r['ttft_p99'] * 1e3:.0f} ms, {r['requests_per_s']:.2f} req/s",
                flush=True,
            )
    report = render(results, args, where, n_req, ceiling)
    print(report)
    if args.write:
        (ROOT / "benchmarks" / "results" / "cluster.md").write_text(report)


POLICIES = ("round_robin", "cache_aware")


def run(
    ckpt: Path,
    policy: str,
    store: bool,
    logs: Path,
    options: list[str],
    convs: list[list[str]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One cluster with cold caches (and a fresh store): the workload's figures."""
    master = None
    if store:
        from hybridkv.tiers.store_master import MooncakeMaster

        master = MooncakeMaster(log_dir=logs).start()
        url = f"{master.url}&segment={args.segment_mb}MiB&buffer=32MiB"
        options = [*options, "--kv-store", url]
    try:
        cluster = Cluster(ckpt, args.replicas, policy, logs, options)
        try:
            r = play(
                cluster.url, MODEL, convs, args.concurrency, args.max_tokens, args.think_ms / 1e3
            )
            hits, queries = cluster.cached_fraction()
            r["store_hit_tokens"] = cluster.metric_sum(
                "hybridkv:kv_tier_hit_tokens_total", 'medium="STORE"'
            )
            r["store_no_room"] = cluster.metric_sum(
                "hybridkv:kv_store_failures_total", 'kind="no_room"'
            )
            r["device_full"] = cluster.metric_sum(
                "hybridkv:kv_store_failures_total", 'kind="device_full"'
            )
            r["store_lookups"] = cluster.metric_sum("hybridkv:kv_store_lookups_total")
            r["store_put_bytes"] = cluster.metric_sum(
                "hybridkv:kv_store_bytes_total", 'direction="put"'
            )
            r["store_put_s"] = cluster.metric_sum("hybridkv:kv_store_put_seconds_sum")
            r["store_put_batches"] = cluster.metric_sum("hybridkv:kv_store_put_seconds_count")
            r["store_held"] = cluster.metric_sum("hybridkv:kv_store_held_total")
            r["store_held_s"] = cluster.metric_sum("hybridkv:kv_store_held_seconds_total")
            r["store_late"] = cluster.metric_sum("hybridkv:kv_store_failures_total", 'kind="late"')
        finally:
            cluster.stop()
    finally:
        if master is not None:
            master.stop()
    r["cached"] = hits / queries if queries else 0.0
    return r


if __name__ == "__main__":
    main()
