"""Chained block hashes: chaining, determinism, seeds, extra keys, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from array import array

import pytest
import xxhash
from factories import full, manager, req, toks

from hybridkv import HASH_ALGOS, BlockHasher, KVCacheManager, Request

ROOT_TAG = b"hybridkv/block-hash/v1/"


def _packed(tokens: list[int]) -> bytes:
    return array("I", tokens).tobytes()


def _request_hashes(algo: str, r: Request, block_size: int = 4, seed: int = 0) -> list[bytes]:
    hasher = BlockHasher(block_size, algo, seed)
    r.bind_hasher(hasher)
    return r.block_hashes


# -- the documented formula --------------------------------------------------------
def test_sha256_matches_the_documented_chain() -> None:
    # hash(block i) = sha256(hash(block i-1) || little-endian uint32 tokens);
    # the parent of block 0 is sha256(root tag || seed as int64).
    tokens = toks(9)  # two full blocks of 4 and one leftover token
    root = hashlib.sha256(ROOT_TAG + struct.pack("<q", 0)).digest()
    h0 = hashlib.sha256(root + _packed(tokens[0:4])).digest()
    h1 = hashlib.sha256(h0 + _packed(tokens[4:8])).digest()
    assert BlockHasher(4).hash_tokens(tokens) == [h0, h1]


def test_xxhash_matches_the_documented_chain() -> None:
    seed = 7
    tokens = toks(8)
    root = xxhash.xxh3_128_digest(ROOT_TAG + struct.pack("<q", seed), seed)
    h0 = xxhash.xxh3_128_digest(root + _packed(tokens[0:4]), seed)
    h1 = xxhash.xxh3_128_digest(h0 + _packed(tokens[4:8]), seed)
    assert BlockHasher(4, "xxhash", seed).hash_tokens(tokens) == [h0, h1]


# -- chaining ------------------------------------------------------------------------
@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_changing_a_token_changes_its_block_and_every_later_one(algo: str) -> None:
    hasher = BlockHasher(4, algo)
    base = hasher.hash_tokens(toks(12))
    assert len(base) == 3 and len(set(base)) == 3
    first = toks(12)
    first[1] = 7  # block 0 changes -> blocks 0, 1 and 2 all change
    changed = hasher.hash_tokens(first)
    assert all(a != b for a, b in zip(base, changed, strict=True))
    last = toks(12)
    last[9] = 7  # block 2 changes -> blocks 0 and 1 keep their hashes
    changed = hasher.hash_tokens(last)
    assert changed[:2] == base[:2] and changed[2] != base[2]


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_only_full_blocks_are_hashed(algo: str) -> None:
    hasher = BlockHasher(4, algo)
    assert hasher.hash_tokens(toks(3)) == []
    assert len(hasher.hash_tokens(toks(11))) == 2
    assert hasher.hash_tokens(toks(11)) == hasher.hash_tokens(toks(8))


def test_algorithms_and_seeds_give_different_hashes() -> None:
    tokens = toks(8)
    by_key = {
        (algo, seed): tuple(BlockHasher(4, algo, seed).hash_tokens(tokens))
        for algo in HASH_ALGOS
        for seed in (0, 1, 2**62)
    }
    flat = [h for hashes in by_key.values() for h in hashes]
    assert len(set(flat)) == len(flat) == 12
    # Same key, same hashes.
    assert BlockHasher(4, "xxhash", 1).hash_tokens(tokens) == list(by_key[("xxhash", 1)])


# -- determinism across processes ------------------------------------------------------
_CHILD = r"""
import json
from hybridkv import BlockHasher, Request
out = {}
for algo in ("sha256", "xxhash"):
    for seed in (0, 5):
        r = Request("r", list(range(100, 113)), cache_salt="tenant-a", lora_name="ad",
                    mm_inputs=[("img-1", 3, 6)])
        r.bind_hasher(BlockHasher(4, algo, seed))
        plain = BlockHasher(4, algo, seed).hash_tokens(list(range(100, 113)))
        out[f"{algo}/{seed}"] = [h.hex() for h in r.block_hashes + plain]
print(json.dumps(out))
"""


def _hashes_in_this_process() -> dict[str, list[str]]:
    out = {}
    for algo in HASH_ALGOS:
        for seed in (0, 5):
            r = Request(
                "r",
                toks(13),
                cache_salt="tenant-a",
                lora_name="ad",
                mm_inputs=[("img-1", 3, 6)],
            )
            r.bind_hasher(BlockHasher(4, algo, seed))
            plain = BlockHasher(4, algo, seed).hash_tokens(toks(13))
            out[f"{algo}/{seed}"] = [h.hex() for h in r.block_hashes + plain]
    return out


def test_hashes_are_identical_across_processes_and_hash_seeds() -> None:
    here = _hashes_in_this_process()
    for py_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=py_seed)
        res = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        assert json.loads(res.stdout) == here
    # Sanity: 3 keyed + 3 plain hashes per (algo, seed), all distinct.
    assert all(len(set(v)) == 6 for v in here.values())


# -- hashes follow the request as it grows -----------------------------------------------
def test_block_hashes_track_appended_tokens() -> None:
    kv = manager(16, full(4))
    r = req("a", 6)
    assert r.block_hashes == []  # not bound to a hasher yet
    kv.get_computed_blocks(r)  # the manager binds its hasher
    assert len(r.block_hashes) == 1
    r.append_output_token_ids(106)  # 7 tokens: still one full block
    assert len(r.block_hashes) == 1
    r.append_output_token_ids([107, 108])  # 9 tokens: two full blocks
    hashes = r.block_hashes
    assert hashes == kv.hasher.hash_tokens(toks(9)) and len(hashes) == 2
    # Appends never rewrite earlier entries.
    r.append_output_token_ids(list(range(109, 117)))  # 17 tokens
    assert r.block_hashes[:2] == hashes and len(r.block_hashes) == 4


def test_a_request_cannot_switch_hashers() -> None:
    r = req("a", 8)
    r.bind_hasher(BlockHasher(4))
    r.bind_hasher(BlockHasher(4))  # same key: fine
    with pytest.raises(ValueError, match="already hashed"):
        r.bind_hasher(BlockHasher(2))
    other = KVCacheManager(manager(8, full(4)).kv_cache_config, 64, hash_algo="xxhash")
    with pytest.raises(ValueError, match="already hashed"):
        other.get_computed_blocks(r)


# -- extra keys ------------------------------------------------------------------------
def _hashes(r: Request, algo: str = "sha256") -> list[bytes]:
    return _request_hashes(algo, r)


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_lora_name_keys_every_block(algo: str) -> None:
    plain = _hashes(req("p", 8), algo)
    a = _hashes(req("a", 8, lora_name="adapter-a"), algo)
    b = _hashes(req("b", 8, lora_name="adapter-b"), algo)
    assert len({*plain, *a, *b}) == 6
    hasher = BlockHasher(4, algo)
    r = req("x", 8, lora_name="adapter-a")
    assert hasher.extra_keys(r, 0) == hasher.extra_keys(r, 1) != b""


def test_salt_is_in_block_zero_only_but_the_chain_carries_it() -> None:
    tokens = toks(8)
    salted = _hashes(req("s", tokens, cache_salt="tenant"))
    plain = _hashes(req("p", tokens))
    assert salted[0] != plain[0] and salted[1] != plain[1]
    hasher = BlockHasher(4)
    r = req("s", tokens, cache_salt="tenant")
    assert hasher.extra_keys(r, 0) != b"" and hasher.extra_keys(r, 1) == b""
    # Block 1 of the salted chain is the plain formula over the salted parent.
    assert salted[1] == hashlib.sha256(salted[0] + _packed(tokens[4:8])).digest()
    assert _hashes(req("t", tokens, cache_salt="other"))[0] != salted[0]


def test_mm_input_changes_only_the_blocks_it_overlaps() -> None:
    # 12 tokens, blocks [0-3][4-7][8-11]; the image covers tokens 5 and 6.
    tokens = toks(12)
    plain = _hashes(req("p", tokens))
    img = _hashes(req("i", tokens, mm_inputs=[("img-1", 5, 2)]))
    assert img[0] == plain[0]  # block 0 does not overlap the image
    assert img[1] != plain[1]  # block 1 does
    assert img[2] != plain[2]  # block 2 only through the chain...
    hasher = BlockHasher(4)
    r = req("i", tokens, mm_inputs=[("img-1", 5, 2)])
    assert hasher.extra_keys(r, 2) == b""  # ...its own extra keys are empty
    assert img[2] == hashlib.sha256(img[1] + _packed(tokens[8:12])).digest()


def test_mm_offsets_are_relative_to_the_block() -> None:
    hasher = BlockHasher(4)
    # The image spans tokens 3..8: offsets -1 / -5 relative to blocks 1 / 2.
    r = req("r", 12, mm_inputs=[("img", 3, 6)])
    keys = [hasher.extra_keys(r, i) for i in range(3)]
    assert all(keys) and len(set(keys)) == 3
    # The same image at relative offset 1 of block 0 and of block 1: same key.
    r0 = req("r0", 12, mm_inputs=[("img", 1, 2)])
    r1 = req("r1", 12, mm_inputs=[("img", 5, 2)])
    assert hasher.extra_keys(r0, 0) == hasher.extra_keys(r1, 1) != b""
    # Shifting the image by one token inside the same block changes the key.
    r2 = req("r2", 12, mm_inputs=[("img", 6, 2)])
    assert hasher.extra_keys(r2, 1) != hasher.extra_keys(r1, 1)
    assert _hashes(r2)[1] != _hashes(req("r1b", 12, mm_inputs=[("img", 5, 2)]))[1]


def test_mm_extra_keys_at_block_edges_exact_bytes() -> None:
    # Blocks of 4: [0-3][4-7][8-11]. "a" covers tokens 2-3 and ends exactly where
    # block 1 starts; "b" covers 8-9 and starts exactly where block 1 ends. Each is
    # in one block only. An "M" key is b"M", the payload length as uint32, then
    # the offset from the block start as int64 and the content hash.
    tokens = toks(12)
    r = req("r", tokens, mm_inputs=[("a", 2, 2), ("b", 8, 2)])
    hasher = BlockHasher(4)
    key_a = b"M" + struct.pack("<I", 9) + struct.pack("<q", 2) + b"a"
    key_b = b"M" + struct.pack("<I", 9) + struct.pack("<q", 0) + b"b"
    assert [hasher.extra_keys(r, i) for i in range(3)] == [key_a, b"", key_b]
    root = hashlib.sha256(ROOT_TAG + struct.pack("<q", 0)).digest()
    h0 = hashlib.sha256(root + _packed(tokens[0:4]) + key_a).digest()
    h1 = hashlib.sha256(h0 + _packed(tokens[4:8])).digest()
    h2 = hashlib.sha256(h1 + _packed(tokens[8:12]) + key_b).digest()
    assert _hashes(r) == [h0, h1, h2]


def test_mm_content_hash_matters() -> None:
    tokens = toks(8)
    a = _hashes(req("a", tokens, mm_inputs=[("img-a", 4, 4)]))
    b = _hashes(req("b", tokens, mm_inputs=[("img-b", 4, 4)]))
    same = _hashes(req("c", tokens, mm_inputs=[(b"img-a", 4, 4)]))  # bytes == utf-8 str
    assert a[0] == b[0] and a[1] != b[1]
    assert same == a


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": True},
        {"block_size": 4.0},
        {"block_size": 0},
        {"block_size": 4, "seed": True},
        {"block_size": 4, "seed": 1.0},
        {"block_size": 4, "seed": -1},
        {"block_size": 4, "seed": 2**63},
    ],
)
def test_hasher_rejects_bools_floats_and_out_of_range_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"block_size must be|hash seed must be"):
        BlockHasher(**kwargs)  # type: ignore[arg-type]
    BlockHasher(1, seed=2**63 - 1)  # the largest seed is fine


@pytest.mark.parametrize("algo", ["md5", "SHA256", "", "xxh64"])
def test_unknown_algorithm(algo: str) -> None:
    with pytest.raises(ValueError, match="hash_algo"):
        BlockHasher(4, algo)
    with pytest.raises(ValueError, match="hash_algo"):
        manager(8, full(4), hash_algo=algo)


def test_bad_hasher_arguments() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockHasher(0)
    with pytest.raises(ValueError, match="seed"):
        BlockHasher(4, seed=-1)
    with pytest.raises(ValueError, match="seed"):
        BlockHasher(4, seed=2**63)


@pytest.mark.parametrize("bad", [[-1], [2**32], [1, "2"], [1.5], [None]])
def test_invalid_prompt_token_ids(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("r", bad)  # type: ignore[arg-type]


def test_token_id_range_edges_are_accepted() -> None:
    r = Request("r", [0, 2**32 - 1, 5, 6])
    assert list(r.all_token_ids) == [0, 2**32 - 1, 5, 6]
    assert len(BlockHasher(4).hash_tokens(list(r.all_token_ids))) == 1


@pytest.mark.parametrize("bad", [-1, 2**32, [3, -3], ["x"]])
def test_invalid_output_token_ids_change_nothing(bad: object) -> None:
    r = req("r", 4)
    r.bind_hasher(BlockHasher(4))
    with pytest.raises(ValueError, match="token_ids"):
        r.append_output_token_ids(bad)  # type: ignore[arg-type]
    assert r.num_tokens == 4 and len(r.block_hashes) == 1
