"""A conversation's next turn, sent to another replica the moment the first turn's
``generate`` returns, hits the first turn's reply from the shared store, under
``hybrid`` (``hybridkv.offload.write_barrier``).

Replica A's puts are slowed (each batch sleeps ``SLOW_PUT`` s on the store
tier's thread, as a loaded network would), so a put still in flight when A's
call returns would be a miss on B. A's ``generate`` returns once the writes
queued by its last step have ended: B, asked right after, with a cold device and
the store alone under it, hits up to the end of the reply's last full block
(``E``, past the prompt) and gives a cold engine's tokens, which are
transformers' too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from oracle import check_against_hf, random_prompt, run_engine, shared_block_size
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.tiers.store_master import MooncakeMaster

BLOCK = 8
PROMPT = random_prompt(50, 23)  # ends mid-block
REPLY = 24  # A computes 50 + 23 tokens: E = 72 (Jamba, blocks of 32: 64), past the prompt
NEXT = [11, 12, 13]  # the user's next message
SMALL = "&segment=16MiB&buffer=16MiB"
SLOW_PUT = 0.3


def _llm(ckpt: Path, **kw: object) -> LLM:
    return LLM(ckpt, block_size=BLOCK, max_model_len=112, dtype="float32", **kw)  # type: ignore[arg-type]


def _slow_puts(llm: LLM) -> None:
    """Each batch put of ``llm``'s store tier takes ``SLOW_PUT`` s longer."""
    assert llm.tiers is not None and llm.tiers.store is not None
    client = llm.tiers.store.client
    put = client.put_from  # both paths put through it (zerocopy=0: ``put`` calls it)

    def slow(*args: Any) -> Any:
        time.sleep(SLOW_PUT)
        return put(*args)

    client.put_from = slow  # type: ignore[method-assign]


@pytest.mark.parametrize("family", ["gemma3", "jamba"])
def test_the_next_turn_on_another_replica_hits_the_reply(
    family: str, mooncake_master: MooncakeMaster, tmp_path: Path
) -> None:
    ckpt = save_checkpoint(FAMILY_CONFIGS[family](), tmp_path / family)
    url = mooncake_master.url + SMALL
    a = _llm(ckpt, cache_policy="hybrid", kv_store=url)
    b = _llm(ckpt, cache_policy="hybrid", kv_store=url)
    cold = _llm(ckpt, cache_policy="hybrid")
    try:
        _slow_puts(a)
        (first,) = a.generate(
            [{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=REPLY), use_tqdm=False
        )
        reply = list(first.outputs[0].token_ids)
        nxt = [*PROMPT, *reply, *NEXT]  # sent at once, to B
        computed = len(PROMPT) + len(reply) - 1  # the last sampled token is not computed
        block = shared_block_size(a)  # Jamba's attention page is a Mamba page: 32
        end = computed - computed % block
        assert end > len(PROMPT)

        (out,) = check_against_hf(ckpt, b, [nxt], 4)
        assert b.tiers is not None
        assert int(out.num_cached_tokens) == end, "B missed the first turn's reply"
        assert b.tiers.stats.store_hit_tokens == end and b.tiers.stats.load_failures == 0
        want, _ = run_engine(cold, [nxt], 4)
        assert out.outputs[0].token_ids == want[0].outputs[0].token_ids
        assert a.tiers is not None
        stats = a.tiers.stats  # A's call waited for its slow puts, and not in vain
        assert stats.store_waits >= 1 and stats.store_late == 0
        assert stats.store_wait_seconds >= SLOW_PUT / 2
        a.manager.check_integrity()
        a.tiers.check_integrity()
    finally:
        for llm in (b, a):
            llm.close()


def test_with_finish_0_generate_does_not_wait_for_the_store(
    mooncake_master: MooncakeMaster, tmp_path: Path
) -> None:
    """``finish=0`` in the URL: no barrier, ``generate`` returns with its slow puts in
    flight (a next turn elsewhere may then miss them)."""
    ckpt = save_checkpoint(FAMILY_CONFIGS["gemma3"](), tmp_path / "gemma3")
    a = _llm(ckpt, cache_policy="hybrid", kv_store=mooncake_master.url + SMALL + "&finish=0")
    try:
        _slow_puts(a)
        a.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=2), use_tqdm=False)
        tiers = a.tiers
        assert tiers is not None and tiers.store is not None
        assert tiers.stats.store_waits == 0
        assert tiers.store.stats.stores < tiers.stats.store_writes  # the free's put: in flight
        assert tiers.store_barrier().done()  # an empty barrier
    finally:
        a.close()
