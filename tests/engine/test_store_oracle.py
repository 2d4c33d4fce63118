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
(sliding + full; ``hybrid``) in fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import check_against_hf, random_prompt, run_engine
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

from hybridkv.engine import LLM
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
