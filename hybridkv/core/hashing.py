"""Chained block hashes for automatic prefix caching.

``hash(block i) = H(hash(block i-1) || token bytes of block i || extra keys)``,
for full blocks only; the parent of block 0 is a root derived from the seed.
Token ids are packed as little-endian uint32 (``array('I')``), so one block's
message has a fixed-length head and the tagged, length-prefixed extra keys
after it cannot be confused with tokens.

Extra keys, in this order (each tagged and length-prefixed):
- ``L``: the LoRA name (every block of a LoRA request);
- ``M``: for each multimodal input overlapping the block, its content hash and
  its offset relative to the block start (negative when it began earlier);
- ``S``: the cache salt, in the first block only (the chain carries it on).

Algorithms: ``sha256`` (default; collision-resistant, safe when tenants share a
cache) and ``xxhash`` (xxh3-128, fast and non-cryptographic: the block pool
compares stored token ids on every hit). Both are deterministic across
processes for a given seed (no dependence on ``PYTHONHASHSEED``).
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Callable, Sequence
from typing import Protocol

import xxhash

from hybridkv.core.token_ids import pack_token_ids

BlockHash = bytes
#: A multimodal placeholder: ``(content_hash, offset, length)`` in prompt positions.
MMInput = tuple[str | bytes, int, int]


class ExtraKeySource(Protocol):
    """What a block's extra keys are made of (a ``Request`` is one)."""

    @property
    def lora_name(self) -> str | None: ...

    @property
    def mm_inputs(self) -> Sequence[MMInput]: ...

    @property
    def cache_salt(self) -> str | None: ...


HASH_ALGOS = ("sha256", "xxhash")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_TOKEN_BYTES = 4
# The root tag fixes the domain; changing it changes every hash.
_ROOT_TAG = b"hybridkv/block-hash/v1/"


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _tagged(tag: bytes, payload: bytes) -> bytes:
    return tag + _U32.pack(len(payload)) + payload


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


class BlockHasher:
    """Hashes a request's full blocks of ``block_size`` tokens, incrementally.

    It takes plain data (tokens, the hashes so far, extra keys), never a
    request. Contract: ``extend`` appends the hashes of every full block that
    is not hashed yet and never changes existing entries. Two hashers with
    equal ``key`` produce identical hashes.
    """

    __slots__ = ("_fn", "algo", "block_size", "key", "root", "seed")

    def __init__(self, block_size: int, algo: str = "sha256", seed: int = 0) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if algo not in HASH_ALGOS:
            raise ValueError(f"hash_algo must be one of {HASH_ALGOS}, got {algo!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"hash seed must be an int in [0, 2**63), got {seed!r}")
        self.block_size = block_size
        self.algo = algo
        self.seed = seed
        fn: Callable[[bytes], bytes]
        if algo == "sha256":
            fn = _sha256
        else:
            xx = xxhash.xxh3_128_digest

            def fn(data: bytes) -> bytes:
                return xx(data, seed)

        self._fn = fn
        self.root: BlockHash = fn(_ROOT_TAG + _I64.pack(seed))
        self.key = (algo, seed, block_size)

    @property
    def is_cryptographic(self) -> bool:
        """True when collisions are infeasible (no token check needed on hits)."""
        return self.algo == "sha256"

    def extend(
        self,
        hashes: list[BlockHash],
        tokens: Sequence[int],
        packed_prefix: bytes = b"",
        keys: ExtraKeySource | None = None,
    ) -> None:
        """Append to ``hashes`` the hash of every full block of ``tokens`` not hashed yet.

        ``hashes`` holds the first ``len(hashes)`` block hashes of ``tokens``
        (the chain's state) and only grows; existing entries never change.
        ``packed_prefix``: optionally the first tokens already packed as
        little-endian uint32 (a prompt's bytes), read instead of re-packing
        them. ``keys``: the extra keys' source, or None when it has none.
        """
        bs = self.block_size
        start = len(hashes)
        end = len(tokens) // bs
        if end <= start:
            return
        step = bs * _TOKEN_BYTES
        if end * step <= len(packed_prefix):
            data = packed_prefix[start * step : end * step]
        else:
            data = array("I", tokens[start * bs : end * bs]).tobytes()
        parent = hashes[-1] if hashes else self.root
        if keys is None:
            offsets = range(0, len(data), step)
            if self.algo == "sha256":
                sha = hashlib.sha256
                hashes.extend(parent := sha(parent + data[o : o + step]).digest() for o in offsets)
            else:
                xx, seed = xxhash.xxh3_128_digest, self.seed
                hashes.extend(parent := xx(parent + data[o : o + step], seed) for o in offsets)
            return
        fn = self._fn
        for j, off in enumerate(range(0, len(data), step)):
            extra = self.extra_keys(keys, start + j)
            parent = fn(parent + data[off : off + step] + extra)
            hashes.append(parent)

    def extra_keys(self, keys: ExtraKeySource, block_index: int) -> bytes:
        """The encoded extra keys of one block (empty when it has none)."""
        parts = []
        if keys.lora_name is not None:
            parts.append(_tagged(b"L", _as_bytes(keys.lora_name)))
        if keys.mm_inputs:
            start = block_index * self.block_size
            end = start + self.block_size
            for content_hash, offset, length in keys.mm_inputs:
                if offset < end and offset + length > start:
                    payload = _I64.pack(offset - start) + _as_bytes(content_hash)
                    parts.append(_tagged(b"M", payload))
        if block_index == 0 and keys.cache_salt is not None:
            parts.append(_tagged(b"S", _as_bytes(keys.cache_salt)))
        return b"".join(parts)

    def hash_tokens(self, token_ids: list[int]) -> list[BlockHash]:
        """Hashes of the full blocks of a bare token list (no extra keys)."""
        hashes: list[BlockHash] = []
        self.extend(hashes, token_ids, pack_token_ids(list(token_ids), "token_ids").tobytes())
        return hashes
