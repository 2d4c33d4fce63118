"""A bounded, mixed load against one ``hybridkv serve`` (issue 19, section 4).

``run_round`` sends ``requests`` completions from ``concurrency`` client
threads over plain HTTP: streamed and not, a share of streamed clients that
hang up after their first chunk, and a share of invalid bodies. Every valid
prompt is also sent by clients that read to the end, so whatever a client that
hangs up computed, a complete one computed too (an identical second round adds
no new cache keys). A watcher polls ``/health`` the whole time.

As a script it is the soak: ``--rounds`` rounds against a server it starts
on a tiny random checkpoint, with the process's memory, cached blocks and
orphan blocks after each round. ``--replicas N`` starts N servers in the
process and sends request ``k`` to replica ``k mod N``; with ``--store`` they
share one ``mooncake_master`` (``--kv-store``, a master started for the run),
and each round also reports the tokens hit from the store (issue 46's soak).

    python benchmarks/serve_load.py --rounds 5 --requests 300
    python benchmarks/serve_load.py --rounds 5 --replicas 3 --store
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundResult:
    """What one round saw, by client kind."""

    outcomes: Counter[str] = field(default_factory=Counter)
    health_codes: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def plan(requests: int, seed: int, vocab: int = 512) -> list[tuple[str, dict[str, Any]]]:
    """``(kind, body)`` per request: kinds ``full``, ``stream``, ``hangup``, ``invalid``.

    20 % hang up mid-stream, 10 % are invalid; prompts come from a pool of 16
    that complete clients use too.
    """
    rng = random.Random(seed)
    prompts = [
        " ".join(f"w{rng.randrange(5, vocab)}" for _ in range(rng.randrange(4, 24)))
        for _ in range(16)
    ]
    out: list[tuple[str, dict[str, Any]]] = []
    for k in range(requests):
        body: dict[str, Any] = {
            "prompt": prompts[k % len(prompts)],
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = rng.random()
        if r < 0.1:
            bad = rng.choice([{"temperature": -1}, {"max_tokens": 0}, {"n": 0}, {"prompt": ""}])
            out.append(("invalid", dict(body, **bad)))
        elif r < 0.3:
            out.append(("hangup", dict(body, stream=True)))
        elif r < 0.65:
            out.append(("stream", dict(body, stream=True)))
        else:
            out.append(("full", body))
    return out


def _send(port: int, kind: str, body: dict[str, Any]) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        r = conn.getresponse()
        if kind == "invalid":
            r.read()
            return "rejected" if r.status == 400 else f"invalid got {r.status}"
        if r.status != 200:
            return f"{kind} got {r.status}: {r.read()[:200]!r}"
        if kind == "full":
            choice = json.loads(r.read())["choices"][0]
            return "completed" if choice["finish_reason"] == "length" else f"full {choice}"
        if kind == "hangup":
            r.readline()  # the first chunk, then hang up
            return "hung up"
        frames = r.read().decode().strip().split("\n\n")
        if frames[-1] != "data: [DONE]" or '"finish_reason":"length"' not in frames[-2]:
            return f"stream ended with {frames[-2:]}"
        return "completed"
    except OSError as e:
        return f"{kind} failed: {e}"
    finally:
        conn.close()


def run_round(
    port: int | Sequence[int], requests: int = 300, concurrency: int = 32, seed: int = 0
) -> RoundResult:
    """One round (module docstring); bounded by ``requests`` and socket timeouts.
    Several ``port``s: request ``k`` goes to ``port[k % len(port)]``, and the
    watcher polls each in turn."""
    ports = [port] if isinstance(port, int) else list(port)
    result = RoundResult()
    done = threading.Event()

    def watch() -> None:
        k = 0
        while not done.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", ports[k % len(ports)], timeout=30)
            k += 1
            try:
                conn.request("GET", "/health")
                result.health_codes[conn.getresponse().status] += 1
            except OSError:
                result.health_codes[0] += 1
            finally:
                conn.close()
            done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            sends = [(ports[k % len(ports)], *kb) for k, kb in enumerate(plan(requests, seed))]
            for outcome in pool.map(lambda pkb: _send(*pkb), sends):
                if outcome in ("completed", "hung up", "rejected"):
                    result.outcomes[outcome] += 1
                else:
                    result.failures.append(outcome)
    finally:
        done.set()
        watcher.join(60)
    return result


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serving"))
    from live_server import start_server  # type: ignore[import-not-found]
    from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--store", action="store_true", help="the replicas share a Mooncake Store")
    args = ap.parse_args()
    master = None
    options: dict[str, Any] = {}
    if args.store:
        from hybridkv.tiers.store_master import MooncakeMaster

        master = MooncakeMaster().start()
        options["kv_store"] = master.url + "&segment=64MiB&buffer=32MiB"
    servers: list[tuple[Any, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = save_word_tokenizer(save_checkpoint(gemma3_config(), Path(tmp)))
            for _ in range(args.replicas):
                servers.append(start_server(ckpt, **options))
            soak(servers, args)
    finally:
        for live, _ in servers:
            live.stop()
        if master is not None:
            master.stop()


def soak(servers: list[tuple[Any, Any]], args: argparse.Namespace) -> None:
    """The rounds, one table row each (figures summed over the replicas)."""
    ports = [live.port for live, _ in servers]
    print(
        "round | s | completed | hung up | rejected | failures | health | "
        "RSS MB | cached keys | orphan blocks | store hit tokens"
    )
    for k in range(args.rounds):
        t = time.monotonic()
        res = run_round(ports, args.requests, args.concurrency, seed=0)
        wall = time.monotonic() - t
        states = [engine.call(cache_state).result(60) for _, engine in servers]
        hits = sum(engine.call(store_hit_tokens).result(60) for _, engine in servers)
        o = res.outcomes
        print(
            f"{k + 1} | {wall:.1f} | {o['completed']} | {o['hung up']} | "
            f"{o['rejected']} | {len(res.failures)} | {dict(res.health_codes)} | "
            f"{rss_mb():.0f} | {sum(s[0] for s in states)} | {sum(s[1] for s in states)} | "
            f"{hits}",
            flush=True,
        )
        for failure in res.failures[:5]:
            print(f"  failure: {failure}")


def store_hit_tokens(llm: Any) -> int:
    """Tokens this replica loaded from the store so far (0 without one)."""
    tiers = llm.tiers
    return 0 if tiers is None else int(tiers.stats.store_hit_tokens)


def cache_state(llm: Any) -> tuple[int, int]:
    """Distinct cached keys, and orphan blocks (``hybridkv.serving.metrics``)."""
    from hybridkv.serving.metrics import table_blocks

    return sum(len(i) for i in llm.manager.block_pool.cached), len(table_blocks(llm)[1])


if __name__ == "__main__":
    main()
