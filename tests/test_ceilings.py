"""``benchmarks/ceilings.py`` (hit-rate ceilings) and ``pressure_mean.py``,
on hand-worked examples."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ceilings import belady_hits, block_keys, hit_blocks, lru_hits  # noqa: E402
from pressure_mean import PressureMean  # noqa: E402

from hybridkv.sim.trace import TraceRequest  # noqa: E402


def mooncake(hash_ids: tuple[int, ...], length: int) -> TraceRequest:
    return TraceRequest(
        line=1, arrival_s=0.0, input_length=length, output_length=1, hash_ids=hash_ids
    )


def test_block_keys_follow_the_shared_hash_blocks() -> None:
    a = block_keys(mooncake((0, 1, 2), 1536), 256)
    b = block_keys(mooncake((0, 1, 9), 1536), 256)
    c = block_keys(mooncake((0, 1), 1000), 256)  # 3 full blocks of 256
    assert len(a) == 6 and len(c) == 3
    assert a[:4] == b[:4] and a[4] != b[4]  # tokens 1024.. come from hash 2 vs 9
    assert c == a[:3]
    # a block straddling two hash blocks depends on both
    d = block_keys(mooncake((0, 1), 1024), 384)
    e = block_keys(mooncake((0, 5), 1024), 384)
    assert d[0] == e[0] and d[1] != e[1]  # tokens 384..767 span hash blocks 0 and 1


def test_hit_blocks_stop_one_token_short_of_the_prompt() -> None:
    keys = [1, 2, 3]
    assert hit_blocks(keys, 48, 16, {1, 2, 3}) == 2  # (48 - 1) // 16
    assert hit_blocks(keys, 49, 16, {1, 2, 3}) == 3
    assert hit_blocks(keys, 49, 16, {1, 3}) == 1


def test_lru_and_belady_by_hand() -> None:
    # requests as key chains, 1 token per block, prompts one token longer
    reqs = [[1, 2], [3, 4], [1, 2], [3, 4]]
    lengths = [3, 3, 3, 3]
    # two blocks of room: LRU keeps only the last request's chain, never hits
    assert lru_hits(reqs, lengths, 1, 2) == 0
    # Belady drops [3, 4] (used next at 3) for [1, 2] (next at 2): one hit;
    # no choice does better with two blocks
    assert belady_hits(reqs, lengths, 1, 2) == 2
    # room for everything: both hit the repeats
    assert lru_hits(reqs, lengths, 1, 4) == belady_hits(reqs, lengths, 1, 4) == 4


def test_belady_evicts_deeper_blocks_first_on_ties() -> None:
    # all three blocks are next used together: with 2 blocks of room the
    # prefix 1, 2 must survive, not 2, 3 (useless without 1)
    assert belady_hits([[1, 2, 3], [1, 2, 3]], [4, 4], 1, 2) == 2


def test_pressure_mean_counts_only_full_pools() -> None:
    m = PressureMean(100)
    assert m.mean() == {}
    m.add({"full": 50, "mamba": 10})  # 60 % full: ignored
    m.add({"full": 90, "mamba": 5})  # 95 %
    m.add({"full": 80, "mamba": 20})
    assert m.samples == 2
    assert m.mean() == {"full": 85.0, "mamba": 12.5}
