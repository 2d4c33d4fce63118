"""``LLM(kv_events_endpoint=...)`` publishes every step's KV events; a subscriber mirrors them.

A tiny Gemma 3 checkpoint (sliding window 7 on three layers, full attention on
one: four KV cache groups of one layer each) with a small cache, so a batch of
prompts over shared prefixes hits, evicts and re-caches. The subscriber
(tests/kv_subscriber.py) binds on loopback; the engine's publisher connects.
"""

from __future__ import annotations

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from kv_subscriber import MirrorSubscriber, pool_keys  # noqa: E402
from tiny_checkpoints import WINDOW, gemma3_config, save_checkpoint  # noqa: E402

from hybridkv.engine import LLM, SamplingParams  # noqa: E402
from hybridkv.specs import SlidingWindowSpec  # noqa: E402

PROMPTS = [
    {"prompt_token_ids": [5 + (i % 3)] * 12 + list(range(20 + 7 * i, 27 + 7 * i))} for i in range(8)
]
# 80 blocks (one 1 KiB page per block for each of the four groups' layers): room for
# one full-length request and little more, so the cache evicts.
OPTIONS = dict(block_size=4, max_model_len=64, max_num_seqs=2, kv_cache_memory_bytes=80 * 1024)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3_events"))


def test_a_subscriber_mirrors_the_engines_cache(ckpt) -> None:
    params = SamplingParams(max_tokens=4)
    ctx = zmq.Context()
    sub = MirrorSubscriber(ctx, topic="kv@test")
    try:
        events = dict(
            kv_events_endpoint=sub.endpoint,
            kv_events_topic="kv@test",
            kv_events_replay_endpoint="tcp://127.0.0.1:*",
        )
        with LLM(ckpt, **OPTIONS, **events) as llm:
            assert llm.kv_events is not None
            sub.replay_endpoint = llm.kv_events.replay_endpoint
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
            assert llm.kv_events.num_batches > 1  # one batch per step that changed the cache
            sub.catch_up(llm.kv_events.num_batches)
            assert sub.keys == pool_keys(llm.manager.block_pool) != set()
            assert sub.counts["BlockRemoved"] > 0, "the workload never evicted"
            groups = llm.kv_cache_config.kv_cache_groups
            assert llm.kv_cache_config.num_blocks == 80 and len(groups) == 4
            want = {
                (g, "sliding_window", WINDOW)
                if isinstance(grp.kv_cache_spec, SlidingWindowSpec)
                else (g, "full_attention", None)
                for g, grp in enumerate(groups)
            }
            seen = {
                (e["group_idx"], e["kv_cache_spec_kind"], e.get("kv_cache_spec_sliding_window"))
                for batch in sub.batches
                for e in batch[1]
                if e["type"] == "BlockStored"
            }
            assert seen == want
            assert llm.reset_prefix_cache()
            sub.catch_up(llm.kv_events.num_batches)
            assert sub.keys == set() and sub.counts["AllBlocksCleared"] == 1
            llm.manager.check_integrity()
        with pytest.raises(RuntimeError, match="closed"):
            llm.generate(PROMPTS[0], params, use_tqdm=False)
        llm.close()  # idempotent
    finally:
        sub.close()
        ctx.term()
    # Events change nothing else: the same greedy tokens without them.
    plain = LLM(ckpt, **OPTIONS)
    assert plain.kv_events is None and not plain.manager.block_pool.enable_kv_cache_events
    again = plain.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]
    assert plain.manager.take_events() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kv_events_replay_endpoint": "tcp://127.0.0.1:5558"}, "needs kv_events_endpoint"),
        ({"kv_events_topic": "kv"}, "needs kv_events_endpoint"),
        ({"kv_events_endpoint": "127.0.0.1:5557"}, "endpoint must be a ZeroMQ endpoint"),
    ],
)
def test_bad_event_options_fail_before_loading(tmp_path, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        LLM(tmp_path / "no-such-checkpoint", **kwargs)
