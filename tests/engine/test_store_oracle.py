"""A prefix computed on replica A and loaded from the shared store on replica B is
token-identical to transformers and to a cold run on B.

Two engines on one checkpoint join one ``mooncake_master`` (two store clients in
one process: each lends its own segment). A runs a document; its finished request
frees the blocks, which are written to the store (``StoreWrites``). B has only the
store under its pool (no host or disk tier) and a cold device: its hits on the
document, past the shared boundary and exactly on it, can only come from the store.
Each is checked against transformers (tokens exactly, logits at 1e-4) and against
a cold engine, with every integrity check after it. Tiny Jamba (Mamba + attention
+ MoE; both policies), Llama 4 (chunked + full attention; ``lru``) and Gemma 3
(sliding + full; ``hybrid``) in fp32. The same hit while A's request still runs
(its prefill's blocks written as they are computed: ``ComputedStores``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import check_against_hf, random_prompt, run_engine
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.tiers.store_master import MooncakeMaster

DOC = random_prompt(96, 11)  # ends on every family's block boundary
PAST = [*DOC, 7, 8, 9]
BLOCK = 8
N = 2
SMALL = "&segment=16MiB&buffer=16MiB"


_CKPTS: dict[str, Path] = {}


def _ckpt(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if family not in _CKPTS:
        path = tmp_path_factory.mktemp(family)
        _CKPTS[family] = save_checkpoint(FAMILY_CONFIGS[family](), path)
    return _CKPTS[family]


def _llm(ckpt: Path, **kw: object) -> LLM:
    return LLM(ckpt, block_size=BLOCK, max_model_len=112, dtype="float32", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("family", "policy"),
    [("jamba", "lru"), ("jamba", "hybrid"), ("llama4", "lru"), ("gemma3", "hybrid")],
)
def test_a_prefix_from_another_replica_matches_transformers(
    family: str,
    policy: str,
    mooncake_master: MooncakeMaster,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    ckpt = _ckpt(family, tmp_path_factory)
    url = mooncake_master.url + SMALL
    a = _llm(ckpt, cache_policy=policy, kv_store=url)
    b = _llm(ckpt, cache_policy=policy, kv_store=url)
    cold = _llm(ckpt, cache_policy=policy)
    try:
        assert a.tiers is not None and a.tiers.store_writes is not None
        check_against_hf(ckpt, a, [DOC], N)  # computed on A; freed, written to the store
        a.tiers.store_writes.settle(wait=True)
        assert a.tiers.store is not None and a.tiers.store.stats.stores > 0
        tiers = b.tiers
        assert tiers is not None and tiers.host is None and tiers.disk is None
        for prompt in (PAST, DOC):  # past the boundary, then exactly on it
            b.reset_prefix_cache()  # B's device holds nothing: a hit is the store's
            before = tiers.stats.store_hit_tokens
            (out,) = check_against_hf(ckpt, b, [prompt], N)
            hit = int(out.num_cached_tokens)
            assert hit > 0, "no hit from the store"
            assert tiers.stats.store_hit_tokens - before == hit
            assert tiers.stats.load_failures == 0
            want, _ = run_engine(cold, [prompt], N)
            assert out.outputs[0].token_ids == want[0].outputs[0].token_ids
    finally:
        for llm in (b, a):
            llm.close()


@pytest.mark.parametrize(
    ("family", "policy"), [("jamba", "lru"), ("jamba", "hybrid"), ("gemma3", "hybrid")]
)
def test_a_prefix_hits_another_replica_while_its_request_runs(
    family: str,
    policy: str,
    mooncake_master: MooncakeMaster,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A's prefill runs in chunks of 32 tokens and its request is still decoding: the
    blocks its steps computed are in the store already (``ComputedStores``), and B's
    hit on them matches transformers and a cold run."""
    ckpt = _ckpt(family, tmp_path_factory)
    url = mooncake_master.url + SMALL
    a = _llm(ckpt, cache_policy=policy, kv_store=url, max_num_batched_tokens=32)
    b = _llm(ckpt, cache_policy=policy, kv_store=url)
    cold = _llm(ckpt, cache_policy=policy)
    try:
        (running,) = a.make_requests({"prompt_token_ids": DOC}, SamplingParams(max_tokens=8))
        a.scheduler.add_request(running)
        steps = 0
        while running.num_computed_tokens < len(DOC):  # the prefill, chunk by chunk
            a.step()
            steps += 1
        assert steps >= 3 and not running.status.finished
        assert a.tiers is not None and a.tiers.store_writes is not None
        a.tiers.store_writes.settle(wait=True)
        tiers = b.tiers
        assert tiers is not None
        (out,) = check_against_hf(ckpt, b, [PAST], N)
        hit = int(out.num_cached_tokens)
        assert hit > 0, "no hit from the store while A's request runs"
        assert tiers.stats.store_hit_tokens == hit and tiers.stats.load_failures == 0
        want, _ = run_engine(cold, [PAST], N)
        assert out.outputs[0].token_ids == want[0].outputs[0].token_ids
        while not running.status.finished:  # A finishes as if nothing happened
            a.step()
        a.manager.check_integrity()
        a.tiers.check_integrity()
    finally:
        for llm in (b, a):
            llm.close()
