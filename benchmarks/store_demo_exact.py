#!/usr/bin/env python3
"""Issue 46's exactness target on the demo's checkpoint: a prefix computed on replica A
and loaded from the shared Mooncake Store on replica B gives B's cold tokens.

Starts ``mooncake_master`` on loopback (``hybridkv.tiers.store_master``), then three
engines of the demo's Gemma 3 270M (``make demo`` converts it to
``~/.cache/hybridkv/gemma-3-270m-q4_k_m``) in one process: A and B with
``kv_store`` (the store alone under each device pool), C with no store (cold). A
generates each document + question; B then runs the same prompts, whose prefix must
come from the store (``tiers.stats.store_hit_tokens``), and its tokens must equal C's.
Greedy decoding, ``--tokens`` output tokens. Exit status 1 on any difference.

    python benchmarks/store_demo_exact.py [--model DIR] [--doc 1024] [--tokens 24]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hybridkv.engine import LLM, SamplingParams
from hybridkv.tiers.store_master import MooncakeMaster

DEMO = Path.home() / ".cache" / "hybridkv" / "gemma-3-270m-q4_k_m"
SMALL = "&segment=256MiB&buffer=256MiB"


def prompts(doc: int) -> list[list[int]]:
    """Two documents of ``doc`` tokens, each with a question after it (fixed ids)."""
    out = []
    for seed in (1, 2):
        body = [(seed * 7919 + i * 104_729) % 200_000 + 1_000 for i in range(doc)]
        out.append([2, *body, 108, 818, 1_000 + seed])
    return out


def engine(model: Path, doc: int, store: str | None) -> LLM:
    return LLM(
        model,
        dtype="float32",
        device="cpu",
        max_model_len=doc + 128,
        max_num_batched_tokens=doc + 128,
        kv_store=store,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEMO)
    ap.add_argument("--doc", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        print(f"error: no checkpoint at {args.model} (run `make demo` first)", file=sys.stderr)
        return 2
    sp = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    ps = [{"prompt_token_ids": p} for p in prompts(args.doc)]
    with MooncakeMaster() as master:
        url = master.url + SMALL
        a = engine(args.model, args.doc, url)
        a.generate(ps, sp, use_tqdm=False)
        assert a.tiers is not None and a.tiers.store_writes is not None
        a.tiers.store_writes.settle(wait=True)
        b = engine(args.model, args.doc, url)
        got = b.generate(ps, sp, use_tqdm=False)
        assert b.tiers is not None
        hit = b.tiers.stats.store_hit_tokens
        cached = [o.num_cached_tokens for o in got]
        a.close()
        b.close()
    cold = engine(args.model, args.doc, None).generate(ps, sp, use_tqdm=False)
    same = [
        g.outputs[0].token_ids == c.outputs[0].token_ids for g, c in zip(got, cold, strict=True)
    ]
    print(f"model {args.model.name}, float32, {len(ps)} prompts of {args.doc + 4} tokens")
    print(f"replica B: prefix hits {cached} tokens, {hit} of them loaded from the store")
    print(f"replica B's tokens equal a cold engine's: {same}")
    return 0 if all(same) and hit > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
