"""``TickQueue`` and the cost-aware free set built on it, against naive models:
blocks kept with their tick (or key) one by one, searched and sorted."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.free_ticks import TickQueue
from hybridkv.policy.cost_aware import CostAwareEvictionPolicy, last_tick_within, value_class

# ("push", k): k blocks (removed ones first), ("pop", k): pop_upto(k, head tick + k),
# ("remove", i): the i-th live block (mod size).
_OPS = st.lists(
    st.tuples(st.sampled_from(["push", "pop", "remove"]), st.integers(0, 9)), max_size=60
)


@given(ops=_OPS)
def test_tick_queue_is_a_fifo_of_live_blocks(ops: list[tuple[str, int]]) -> None:
    q = TickQueue(3)
    blocks = [KVCacheBlock(i) for i in range(1, 400)]
    spare = list(blocks)  # not in the queue
    model: list[tuple[int, KVCacheBlock]] = []  # (tick, block), oldest first
    clock = 0
    for op, k in ops:
        if op == "push":
            run, spare = spare[:k], spare[k:]
            q.push(run, clock + 1)
            model += [(clock + 1 + j, b) for j, b in enumerate(run)]
            clock += len(run)
        elif op == "pop":
            head = q.head_tick()
            assert head == (model[0][0] if model else None)
            if head is None:
                continue
            got = q.pop_upto(k, head + k)
            want = [b for t, b in model if t <= head + k][:k]
            assert got == want
            model = model[len(want) :]
            spare += got
        elif model:
            _, b = model.pop(k % len(model))
            q.remove(b)
            spare.insert(0, b)  # pushed again first: a new tick, the old entry dead
        q.check_integrity()
        assert list(q) == model
        assert q.num_free_blocks == len(model)


def test_many_hits_keep_the_lists_small() -> None:
    """Tombstones are compacted: a block hit and released again a thousand
    times leaves O(live) entries behind."""
    q = TickQueue(0)
    keep, hot = KVCacheBlock(1), KVCacheBlock(2)
    q.push([keep], 1)
    for tick in range(2, 1002):
        q.push([hot], tick)
        q.remove(hot)
    assert len(q._ticks) < 100
    assert [b for _, b in q] == [keep]
    q.check_integrity()


def _naive_take(
    free: dict[KVCacheBlock, tuple[float, int, int]], stack: list[KVCacheBlock], n: int
) -> list[KVCacheBlock]:
    """The cost-aware ``take`` rule, block by block: the stack's top first;
    then the class whose head has the smallest (key, class) gives its blocks
    while their key is at most every other class head's."""
    out = stack[::-1][:n]
    del stack[len(stack) - len(out) :]
    while len(out) < n:
        heads = {}
        for b, (_, cls, tick) in free.items():
            if cls not in heads or tick < free[heads[cls]][2]:
                heads[cls] = b
        best = min(heads, key=lambda c: (free[heads[c]][0], c))
        limit = min((free[heads[c]][0] for c in heads if c != best), default=math.inf)
        run = sorted((t, b) for b, (key, c, t) in free.items() if c == best and key <= limit)
        for _, b in run[: n - len(out)]:
            out.append(b)
            del free[b]
    return out


@given(
    weight=st.sampled_from([0.0, 1 / 3, 1.0, 2.5]),
    span=st.integers(1, 9),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["release", "first", "take", "remove"]),
            st.integers(0, 6),
            st.sampled_from([1.0, 1.5, 2.0, 3.0, 4.0, 2**0.5, 11.0]),
        ),
        max_size=40,
    ),
)
def test_cost_aware_take_is_the_naive_rule(
    weight: float, span: int, ops: list[tuple[str, int, float]]
) -> None:
    """Keys computed from ticks at ``take`` reuse blocks in the order per-block
    keys would (ties between classes included: small spans and weights like
    1/3 give equal keys)."""
    blocks = [KVCacheBlock(i) for i in range(1, 300)]
    for b in blocks:
        b.block_hash = bytes([b.block_id % 256, b.block_id // 256])
    policy = CostAwareEvictionPolicy(blocks[:span], weight=weight)
    stack = list(blocks[:span][::-1])  # the top is the end
    free: dict[KVCacheBlock, tuple[float, int, int]] = {}
    spare = blocks[span:]
    clock = 0
    for op, k, value in ops:
        if op in ("release", "first"):
            run, spare = spare[:k], spare[k:]
            if op == "first":
                policy.release(run, evict_first=True)
                stack += run
            else:
                policy.release(run, value=value)
                cls = value_class(value)
                for b in run:
                    clock += 1
                    free[b] = (clock / policy.span + weight * cls / 2, cls, clock)
        elif op == "take":
            k = min(k, len(free) + len(stack))
            got = policy.take(k)
            assert got == _naive_take(free, stack, k)
            spare += got
        elif free or stack:
            every = list(policy)
            b = every[k % len(every)]
            policy.remove(b)
            if b in free:
                del free[b]
            else:
                stack.remove(b)
            spare.insert(0, b)
        policy.check_integrity()
        assert policy.num_free_blocks == len(free) + len(stack)


@given(
    span=st.integers(1, 5000),
    bonus=st.sampled_from([0.0, 0.5, 1 / 3, 2.5, 7 / 6, 10.0]),
    tick=st.integers(1, 10**6),
)
def test_thelast_tick_within_a_key_is_exact(span: int, bonus: float, tick: int) -> None:
    """At a limit equal to a tick's key (float rounding and all) that tick is
    the last within; just below it, an earlier one."""
    key = tick / span + bonus
    last = last_tick_within(key, span, bonus)
    assert last >= tick and last / span + bonus <= key < (last + 1) / span + bonus
    below = last_tick_within(math.nextafter(key, -math.inf), span, bonus)
    assert below < tick and (below < 1 or below / span + bonus < key)
