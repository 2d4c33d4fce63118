"""hybridkv replicas behind sglang-router: ``cache_aware`` against ``round_robin``.

Starts ``--replicas`` ``hybridkv serve`` processes of one small random Gemma 3
checkpoint (word-level tokenizer, so text maps to tokens one to one) and the
``sglang-router`` gateway in front of them, all on 127.0.0.1, once per
policy with cold caches. The workload is the multi-turn conversations of
``../shared/traces/mooncake_conversation.jsonl`` (requests whose second hash
id is the same, at least ``--min-turns`` of them), scaled down: each 512-token
hash id becomes ``--words`` words, so turns share exactly the prefixes the
trace says. ``--concurrency`` clients each play whole conversations, turn
after turn, through the OpenAI client (streamed, so TTFT is the first chunk).

Reports the cluster-wide cached-token fraction (prefix-cache hits over
queries, summed from every replica's ``/metrics``), TTFT p50/p99 and
throughput. Targets (issue 19): ``cache_aware`` reaches at least 2x the
cached-token fraction of ``round_robin`` and at least 1.3x lower TTFT p50.

Every process it starts is stopped in a ``finally``; loops are bounded in
count and time.

    python benchmarks/bench_cluster.py                 # prints the table
    python benchmarks/bench_cluster.py --write         # and results/cluster.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine_info import machine  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
MODEL = "bench"
VOCAB = 512


def conversations(
    path: Path, n: int, words: int, min_turns: int, max_turns: int, max_blocks: int
) -> list[list[str]]:
    """The first ``n`` multi-turn conversations of the trace, as text prompts."""
    convs: dict[int, list[list[int]]] = defaultdict(list)
    order: list[int] = []
    with path.open() as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            if len(ids) < 2 or len(ids) > max_blocks:
                continue
            if ids[1] not in convs:
                order.append(ids[1])
            convs[ids[1]].append(ids)
    picked = [convs[k][:max_turns] for k in order if len(convs[k]) >= min_turns][:n]

    def block(h: int) -> str:
        return " ".join(f"w{5 + (h * 7919 + j * 104729) % (VOCAB - 5)}" for j in range(words))

    return [[" ".join(block(h) for h in turn) for turn in conv] for conv in picked]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while get(url)[0] != 200:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready in time")
        time.sleep(0.2)


class Cluster:
    """Replicas + gateway; ``stop`` ends every process it started."""

    def __init__(self, ckpt: Path, replicas: int, policy: str, logs: Path, kv_bytes: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.replica_urls: list[str] = []
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            NO_PROXY="127.0.0.1",
        )
        bindir = Path(sys.executable).parent
        try:
            deadline = time.monotonic() + 300
            for k in range(replicas):
                port = free_port()
                cmd = [
                    str(bindir / "hybridkv"),
                    "serve",
                    str(ckpt),
                    "--port",
                    str(port),
                    "--served-model-name",
                    MODEL,
                    "--max-model-len",
                    "1024",
                    "--max-num-seqs",
                    "8",
                    "--kv-cache-memory-bytes",
                    str(kv_bytes),
                    "--log-level",
                    "warning",
                ]
                self._start(cmd, env, logs / f"{policy}-replica{k}.log")
                self.replica_urls.append(f"http://127.0.0.1:{port}")
            for url, proc in zip(self.replica_urls, self.procs, strict=True):
                wait_ready(url + "/health", proc, deadline)
            port = free_port()
            router = shutil.which("sglang-router", path=str(bindir)) or "sglang-router"
            cmd = [
                router,
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                policy,
                "--log-level",
                "warn",
                "--worker-urls",
                *self.replica_urls,
            ]
            self._start(cmd, env, logs / f"{policy}-router.log")
            self.url = f"http://127.0.0.1:{port}"
            wait_ready(self.url + "/v1/models", self.procs[-1], deadline)
        except BaseException:
            self.stop()
            raise

    def _start(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    def cached_fraction(self) -> tuple[float, float]:
        """Prefix-cache hit and query tokens summed over the replicas."""
        hits = queries = 0.0
        for url in self.replica_urls:
            _, text = get(url + "/metrics")
            for line in text.splitlines():
                if line.startswith("hybridkv:prefix_cache_hits_total"):
                    hits += float(line.rsplit(" ", 1)[1])
                elif line.startswith("hybridkv:prefix_cache_queries_total"):
                    queries += float(line.rsplit(" ", 1)[1])
        return hits, queries


def play(url: str, convs: list[list[str]], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Each client plays whole conversations; TTFT per request, wall time."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    ttfts: list[float] = []
    tokens = 0
    lock = threading.Lock()

    def conversation(turns: list[str]) -> None:
        nonlocal tokens
        for prompt in turns:
            t0 = time.perf_counter()
            first = None
            n = 0
            for chunk in client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - t0
                n += len(chunk.choices[0].text.split()) if chunk.choices else 0
            with lock:
                ttfts.append(first if first is not None else time.perf_counter() - t0)
                tokens += n

    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(conversation, convs))
    wall = time.perf_counter() - t
    ttfts.sort()
    return {
        "requests": len(ttfts),
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p99": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
        "wall": wall,
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(ttfts) / wall,
    }


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=45)
    ap.add_argument("--min-turns", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--words", type=int, default=8, help="words per 512-token hash id")
    ap.add_argument("--max-blocks", type=int, default=120, help="skip longer trace requests")
    ap.add_argument("--concurrency", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--kv-cache-mb",
        type=float,
        default=8,
        help="KV cache per replica (MB): a share of the working set",
    )
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/cluster.md")
    args = ap.parse_args()
    convs = conversations(
        TRACE, args.conversations, args.words, args.min_turns, args.max_turns, args.max_blocks
    )
    n_req = sum(len(c) for c in convs)
    print(f"{len(convs)} conversations, {n_req} requests", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "ckpt")
        logs = Path(tmp)
        for policy in ("round_robin", "cache_aware"):
            cluster = Cluster(ckpt, args.replicas, policy, logs, int(args.kv_cache_mb * 2**20))
            try:
                r = play(cluster.url, convs, args.concurrency, args.max_tokens)
                hits, queries = cluster.cached_fraction()
            finally:
                cluster.stop()
            r["cached"] = hits / queries if queries else 0.0
            results[policy] = r
            print(
                f"{policy}: cached {r['cached']:.1%}, TTFT p50 {r['ttft_p50'] * 1e3:.0f} ms, "
                f"p99 {r['ttft_p99'] * 1e3:.0f} ms, {r['requests_per_s']:.2f} req/s",
                flush=True,
            )
    report = render(results, args, len(convs), n_req)
    print(report)
    if args.write:
        (ROOT / "benchmarks" / "results" / "cluster.md").write_text(report)


def render(results: dict[str, dict[str, Any]], args: Any, n_conv: int, n_req: int) -> str:
    rr, ca = results["round_robin"], results["cache_aware"]
    lines = [
        "# hybridkv replicas behind sglang-router: cache_aware vs round_robin",
        "",
        f"Machine: {machine()} (AVX2; no AVX-512 or AMX needed: fp32 on the C kernels). "
        f"Generated by `benchmarks/bench_cluster.py` on {time.strftime('%Y-%m-%d')}.",
        "",
        f"{args.replicas} replicas (`hybridkv serve`, one thread each) of a random Gemma 3 "
        f"(hidden 384, 5 sliding + 1 full layer, word-level tokenizer) behind `sglang-router` "
        f"on 127.0.0.1. Workload: the first {n_conv} conversations of "
        f"`mooncake_conversation.jsonl` with at least {args.min_turns} turns (up to "
        f"{args.max_turns}), {n_req} requests; each 512-token hash id is {args.words} words; "
        f"{args.concurrency} clients each play whole conversations, streamed, "
        f"{args.max_tokens} output tokens; {args.kv_cache_mb:g} MB of KV cache per replica "
        f"(~{int(args.kv_cache_mb * 2**20 / 6144)} tokens of this model, fp32).",
        "",
        "| | round_robin | cache_aware | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| cached-token fraction | {rr['cached']:.1%} | {ca['cached']:.1%} | "
        f"{ca['cached'] / max(rr['cached'], 1e-9):.2f}x |",
        f"| TTFT p50 (ms) | {rr['ttft_p50'] * 1e3:.0f} | {ca['ttft_p50'] * 1e3:.0f} | "
        f"{rr['ttft_p50'] / ca['ttft_p50']:.2f}x lower |",
        f"| TTFT p99 (ms) | {rr['ttft_p99'] * 1e3:.0f} | {ca['ttft_p99'] * 1e3:.0f} | "
        f"{rr['ttft_p99'] / ca['ttft_p99']:.2f}x lower |",
        f"| requests / s | {rr['requests_per_s']:.2f} | {ca['requests_per_s']:.2f} | "
        f"{ca['requests_per_s'] / rr['requests_per_s']:.2f}x |",
        f"| output tokens / s | {rr['tokens_per_s']:.1f} | {ca['tokens_per_s']:.1f} | |",
        "",
        "Targets: cached-token fraction >= 2x, TTFT p50 >= 1.3x lower: "
        f"{'met' if ca['cached'] >= 2 * rr['cached'] else 'NOT met'}, "
        f"{'met' if rr['ttft_p50'] >= 1.3 * ca['ttft_p50'] else 'NOT met'}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
