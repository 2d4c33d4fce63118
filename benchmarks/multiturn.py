#!/usr/bin/env python3
"""A multi-turn chat workload in the shape of SGLang's ``bench_multiturn``, as
token-id prompts, for the policy ablation's second non-Mooncake workload.

Unlike ``multi_round_qa.py`` (one system prompt and a document per pair of
users, turns of 100-500 tokens), nothing here is shared between clients and
every length is drawn from a log-normal, to the token (no 512-token units):

- each client opens with a first message of about ``first_median`` tokens
  (log-normal, sigma ``first_sigma``: a few thousand-token pastes, mostly
  short openings);
- each later turn appends the model's answer to the previous turn (about
  ``answer_median`` tokens) and a new question (about ``question_median``);
- a client sends ``randint(1, 2 * rounds - 1)`` turns (mean ``rounds``);
- ``active`` clients talk at once: each request is the next turn of one of
  them, drawn uniformly; a client that has sent all its turns leaves and the
  next one joins, until ``requests`` are drawn or every client is done.

Every request asks for one output token (the replay measures prefix hits, not
decoding; the answer tokens of the next turn are new to the cache, as a chat
template's re-rendered answer often is); every timestamp is 0. Deterministic
for a seed.

    python benchmarks/multiturn.py --requests 1000 --out multiturn.jsonl
    hybridkv simulate bamba-9b --trace multiturn.jsonl --memory 4GB --policy lru,hybrid \\
        --arrivals closed --max-num-seqs 1
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from multi_round_qa import VOCAB, write_jsonl  # noqa: E402

from hybridkv.sim.trace import TraceRequest  # noqa: E402


def multiturn(
    clients: int = 512,
    requests: int = 1000,
    seed: int = 0,
    *,
    active: int = 64,
    rounds: int = 8,
    first_median: int = 1_200,
    first_sigma: float = 1.0,
    question_median: int = 120,
    answer_median: int = 300,
    turn_sigma: float = 0.7,
    max_tokens: int = 32_000,
) -> list[TraceRequest]:
    """Up to ``requests`` prompts of the module docstring's workload (seeded by ``seed``).

    Lengths are ``round(median * exp(sigma * N(0, 1)))``, at least 1; a client
    whose next prompt would pass ``max_tokens`` leaves instead. Each request is one
    client's whole conversation so far (``TraceRequest``, ``prompt`` set, arrival
    0, one output token, ``line`` its 1-based index).
    """
    if min(clients, requests, active, rounds) < 1:
        raise ValueError(
            f"clients, requests, active and rounds must be >= 1, "
            f"got {clients}, {requests}, {active}, {rounds}"
        )
    if min(first_median, question_median, answer_median) < 1 or max_tokens < 1:
        raise ValueError("the medians and max_tokens must be >= 1 token")
    rng = random.Random(seed)

    def length(median: int, sigma: float) -> int:
        return max(1, round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    joined = 0
    talking: list[tuple[list[int], int]] = []  # (history, turns left)
    out: list[TraceRequest] = []
    while len(out) < requests:
        while len(talking) < active and joined < clients:
            joined += 1
            turns = rng.randint(1, 2 * rounds - 1)
            talking.append((tokens(min(max_tokens, length(first_median, first_sigma))), turns))
        if not talking:
            break
        k = rng.randrange(len(talking))
        history, left = talking[k]
        out.append(TraceRequest(len(out) + 1, 0.0, len(history), 1, prompt=tuple(history)))
        turn = length(answer_median, turn_sigma) + length(question_median, turn_sigma)
        if left == 1 or len(history) + turn > max_tokens:
            talking.pop(k)
        else:
            talking[k] = (history + tokens(turn), left - 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=512)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--active", type=int, default=64, help="clients talking at once")
    ap.add_argument("--rounds", type=int, default=8, help="mean turns per client")
    ap.add_argument("--out", type=Path, required=True, help="the JSONL trace to write")
    args = ap.parse_args(argv)
    requests = multiturn(
        args.clients, args.requests, args.seed, active=args.active, rounds=args.rounds
    )
    write_jsonl(requests, args.out)
    tokens = sum(r.input_length for r in requests)
    print(f"wrote {len(requests)} requests ({tokens:,} prompt tokens) to {args.out}")


if __name__ == "__main__":
    main()
