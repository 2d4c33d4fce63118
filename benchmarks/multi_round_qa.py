#!/usr/bin/env python3
"""A multi-round QA workload (the shape of LMCache's ``multi-round-qa`` and
SGLang's ``bench_multiturn``), as token-id prompts, and a JSONL writer for it.

The workload, with the defaults (deterministic for a seed): 96 requests of 32
users sharing an 800-token system prompt; each pair of users (``sharing``)
shares a document of 6,000-14,000 tokens, and each user's conversation starts
with 100-500 tokens of its own and grows by 100-500 tokens a turn (prompts of
7,000-19,000 tokens at 96 requests); users are drawn with a skew (user ``u``
with weight about ``exp(-3 u / users)``: a few come back often, most rarely),
so reuse distances vary. Every request asks for one output token (the replay
measures prefix hits, not decoding); every timestamp is 0.

``multi_round_qa`` with its defaults is the workload of
``tests/sim/test_policy_worth.py``: keep its defaults and the order of its
random draws unchanged, or that test's measured factors no longer hold.

    python benchmarks/multi_round_qa.py --users 32 --requests 1000 --out mrqa.jsonl
    hybridkv simulate jamba-v0.1 --trace mrqa.jsonl --memory 6GB --policy lru,hybrid \\
        --arrivals closed --max-num-seqs 1
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hybridkv.sim.trace import TraceRequest  # noqa: E402

#: Token ids are drawn from ``[1, VOCAB)``.
VOCAB = 30_000


def multi_round_qa(
    users: int = 32,
    requests: int = 96,
    seed: int = 0,
    *,
    system_tokens: int = 800,
    doc_tokens: tuple[int, int] = (6_000, 14_000),
    turn_tokens: tuple[int, int] = (100, 500),
    sharing: int = 2,
) -> list[TraceRequest]:
    """``requests`` prompts of the module docstring's workload (seeded by ``seed``).

    ``users // sharing`` documents of ``randrange(*doc_tokens)`` tokens each follow
    one shared system prompt of ``system_tokens``; user ``u`` reads document
    ``u // sharing`` (``users`` must be a multiple of ``sharing``), opens with
    ``randrange(*turn_tokens)`` tokens and adds as many at each of its turns.
    Each request is one user's whole conversation so far (``TraceRequest``,
    ``prompt`` set, arrival 0, one output token, ``line`` its 1-based index).
    """
    if users < 1 or requests < 1 or sharing < 1:
        raise ValueError(
            f"users, requests and sharing must be >= 1, got {users}, {requests}, {sharing}"
        )
    if users % sharing:
        raise ValueError(f"users ({users}) must be a multiple of sharing ({sharing})")
    for name, (low, high) in (("doc_tokens", doc_tokens), ("turn_tokens", turn_tokens)):
        if not 1 <= low < high:
            raise ValueError(f"{name} must be a range (low, high) with 1 <= low < high")
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    system = tokens(system_tokens)
    docs = [system + tokens(rng.randrange(*doc_tokens)) for _ in range(users // sharing)]
    history = {u: docs[u // sharing] + tokens(rng.randrange(*turn_tokens)) for u in range(users)}
    out = []
    for k in range(requests):
        u = min(int(rng.expovariate(3 / users)), users - 1)  # user 0 the most often
        history[u] = history[u] + tokens(rng.randrange(*turn_tokens))
        prompt = tuple(history[u])
        out.append(TraceRequest(k + 1, 0.0, len(prompt), 1, prompt=prompt))
    return out


def write_jsonl(requests: list[TraceRequest], path: Path) -> None:
    """Write ``requests`` as a token-prompt trace ``hybridkv simulate --trace`` reads."""
    with path.open("w") as f:
        for r in requests:
            assert r.prompt is not None
            line = {
                "timestamp": round(r.arrival_s * 1000),
                "prompt_token_ids": list(r.prompt),
                "output_length": r.output_length,
            }
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--system-tokens", type=int, default=800)
    ap.add_argument("--doc-tokens", type=int, nargs=2, default=(6_000, 14_000))
    ap.add_argument("--turn-tokens", type=int, nargs=2, default=(100, 500))
    ap.add_argument("--sharing", type=int, default=2, help="users per document")
    ap.add_argument("--out", type=Path, required=True, help="the JSONL trace to write")
    args = ap.parse_args(argv)
    requests = multi_round_qa(
        args.users,
        args.requests,
        args.seed,
        system_tokens=args.system_tokens,
        doc_tokens=tuple(args.doc_tokens),
        turn_tokens=tuple(args.turn_tokens),
        sharing=args.sharing,
    )
    write_jsonl(requests, args.out)
    tokens = sum(r.input_length for r in requests)
    print(f"wrote {len(requests)} requests ({tokens:,} prompt tokens) to {args.out}")


if __name__ == "__main__":
    main()
