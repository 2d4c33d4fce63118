"""The store tier under ``LLM`` (Gemma 3: sliding + full attention): its options, a
store that cannot be reached at start (an error; with ``optional=1`` a start
without it and a late join), the host tier above it, and the master killed mid-run
(requests complete by recompute, one warning, then hits again)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from deferred_device import DeferredWrites
from oracle import random_prompt
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.tiers import TierError, store_client
from hybridkv.tiers.store_master import MooncakeMaster, free_port

MAX_LEN = 112
SMALL = "&segment=16MiB&buffer=16MiB"
DOC = random_prompt(96, 31)
PAST = [*DOC, 5, 6, 7]
SP = SamplingParams(max_tokens=2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def cold(ckpt: Path) -> LLM:
    return LLM(ckpt, block_size=4, max_model_len=MAX_LEN, device="cpu")


def _llm(ckpt: Path, url: str, **kw: object) -> LLM:
    return LLM(ckpt, block_size=4, max_model_len=MAX_LEN, device="cpu", kv_store=url, **kw)  # type: ignore[arg-type]


def _gen(llm: LLM, prompt: list[int]) -> tuple[list[int], int]:
    out = llm.generate([{"prompt_token_ids": prompt}], SP, use_tqdm=False)[0]
    llm.manager.check_integrity()
    if llm.tiers is not None:
        llm.tiers.check_integrity()
    return list(out.outputs[0].token_ids), int(out.num_cached_tokens)


def _written(llm: LLM) -> None:
    """Wait for the store writes of ``llm``'s freed blocks to land."""
    assert llm.tiers is not None and llm.tiers.store_writes is not None
    llm.tiers.store_writes.settle(wait=True)


def test_a_store_that_cannot_be_reached_is_one_error_before_the_weights(ckpt: Path) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(TierError, match=rf"127\.0\.0\.1:{port} cannot be reached"):
        _llm(ckpt, f"mooncake://127.0.0.1:{port}")
    assert time.monotonic() - started < 5


def test_optional_starts_without_the_store_and_shares_once_it_is_joined(
    ckpt: Path, cold: LLM, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_client, "JOIN_RETRY_SECONDS", 0.1)
    master = MooncakeMaster(lease_ms=300)  # its ports chosen, not started yet
    url = master.url + SMALL + "&optional=1"
    with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
        a = _llm(ckpt, url)
    try:
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and f"127.0.0.1:{master.port} cannot be reached" in warned[0]
        assert "starting without the store" in warned[0]
        want = _gen(cold, PAST)[0]
        assert _gen(a, PAST) == (want, 0)  # it serves meanwhile
        master.start()
        store = a.tiers.store if a.tiers is not None else None
        assert store is not None
        deadline = time.monotonic() + 30
        while not store.client.healthy() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.client.joined, "A did not join the store once it was there"
        _gen(a, DOC)  # freed again, now written
        _written(a)
        b = _llm(ckpt, url)  # there now: joined at start
        try:
            tokens, hit = _gen(b, PAST)
            assert b.tiers is not None and b.tiers.stats.store_hit_tokens == hit > 0
            assert tokens == want
        finally:
            b.close()
    finally:
        a.close()
        master.stop()


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"kv_store": "mooncake://h:1?segment=x"}, "field 'segment'"),
        ({"kv_store": "http://h:1"}, "scheme must be mooncake://"),
        ({"kv_store": "mooncake://h:1", "hash_algo": "xxhash"}, "kv_store needs hash_algo"),
        (
            {"kv_store": "mooncake://h:1", "enable_prefix_caching": False},
            "kv_store needs enable_prefix_caching",
        ),
    ],
)
def test_the_options_are_checked_naming_the_field(
    ckpt: Path, kw: dict[str, object], names: str
) -> None:
    with pytest.raises(ValueError, match=names):
        LLM(ckpt, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_host_then_store_each_restores_its_hit(
    ckpt: Path, cold: LLM, mooncake_master: MooncakeMaster, overlap: bool
) -> None:
    """B has a host tier above the store: its first hit comes from the store (its
    host holds nothing); once the pool reuses those blocks, the next from the host.
    With async scheduling (both engines) on the stand-in device too."""
    url = mooncake_master.url + SMALL
    a = _llm(ckpt, url, async_scheduling=overlap)
    b = _llm(ckpt, url, kv_offloading_size=0.002, async_scheduling=overlap)
    if overlap:
        DeferredWrites(a)
        DeferredWrites(b)
    try:
        want = _gen(cold, PAST)[0]
        _gen(a, DOC)
        _written(a)
        tiers = b.tiers
        assert tiers is not None and tiers.host is not None and tiers.store is not None
        tokens, hit = _gen(b, PAST)
        assert tokens == want and hit > 0 and tiers.stats.store_hit_tokens == hit
        pool = b.manager.block_pool
        pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))  # demoted to the host
        assert pool.num_cached_blocks() == 0 and tiers.host.keys()
        before = tiers.stats.hit_tokens
        tokens, hit = _gen(b, PAST)
        assert tokens == want and hit > 0
        assert tiers.stats.hit_tokens - before == hit
        assert tiers.stats.store_hit_tokens == tiers.stats.hit_tokens - hit  # not the store's
    finally:
        b.close()
        a.close()


def test_a_master_killed_mid_run_recomputes_warns_once_and_hits_again(
    ckpt: Path, cold: LLM, fresh_mooncake_master: MooncakeMaster, caplog: pytest.LogCaptureFixture
) -> None:
    master = fresh_mooncake_master
    url = master.url + SMALL
    a, b = _llm(ckpt, url), _llm(ckpt, url)
    try:
        want = _gen(cold, PAST)[0]
        _gen(a, DOC)
        _written(a)
        assert b.tiers is not None and b.tiers.store is not None
        with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
            master.kill()
            deadline = time.monotonic() + 15
            while b.tiers.store.client.healthy() and time.monotonic() < deadline:
                time.sleep(0.1)
            for _ in range(3):  # every request completes: recomputed, the same tokens
                b.reset_prefix_cache()
                assert _gen(b, PAST) == (want, 0)
            master.start()
            deadline = time.monotonic() + 30
            while not b.tiers.store.client.healthy() and time.monotonic() < deadline:
                time.sleep(0.1)
        outage = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(outage) == 1, [r.getMessage() for r in caplog.records]
        # Back, but the restarted master holds nothing. A was idle through the outage
        # and never saw it: it writes again when it frees the blocks once more (after
        # StoreWrites.rewrite_seconds, 10 s by default: shortened here).
        a.reset_prefix_cache()
        assert a.tiers is not None and a.tiers.store_writes is not None
        a.tiers.store_writes.rewrite_seconds = 0.0
        assert a.tiers.store is not None
        deadline = time.monotonic() + 30  # each client re-registers on its own: A may lag B
        while not a.tiers.store.client.healthy() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert a.tiers.store.client.healthy()
        _gen(a, DOC)
        _written(a)
        b.reset_prefix_cache()
        tokens, hit = _gen(b, PAST)
        assert tokens == want and hit > 0 and b.tiers.stats.store_hit_tokens == hit
    finally:
        b.close()
        a.close()
