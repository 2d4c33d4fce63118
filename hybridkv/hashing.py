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
from collections.abc import Callable
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from hybridkv.request import Request

BlockHash = bytes

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

    Contract: ``update(request)`` appends the hashes of every full block that
    is not hashed yet to ``request``'s hash list and never changes existing
    entries. Two hashers with equal ``key`` produce identical hashes.
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

    def update(self, request: Request) -> None:
        """Hash every newly full block of ``request`` (see class contract)."""
        hashes = request._block_hashes
        bs = self.block_size
        tokens = request._token_ids
        start = len(hashes)
        end = len(tokens) // bs
        if end <= start:
            return
        step = bs * _TOKEN_BYTES
        prompt = request._prompt_bytes
        if end * step <= len(prompt):
            data = prompt[start * step : end * step]
        else:
            data = array("I", tokens[start * bs : end * bs]).tobytes()
        parent = hashes[-1] if hashes else self.root
        if not request._has_extra_keys:
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
            extra = self.extra_keys(request, start + j)
            parent = fn(parent + data[off : off + step] + extra)
            hashes.append(parent)

    def extra_keys(self, request: Request, block_index: int) -> bytes:
        """The encoded extra keys of one block (empty when it has none)."""
        parts = []
        if request.lora_name is not None:
            parts.append(_tagged(b"L", _as_bytes(request.lora_name)))
        if request.mm_inputs:
            start = block_index * self.block_size
            end = start + self.block_size
            for content_hash, offset, length in request.mm_inputs:
                if offset < end and offset + length > start:
                    payload = _I64.pack(offset - start) + _as_bytes(content_hash)
                    parts.append(_tagged(b"M", payload))
        if block_index == 0 and request.cache_salt is not None:
            parts.append(_tagged(b"S", _as_bytes(request.cache_salt)))
        return b"".join(parts)

    def hash_tokens(self, token_ids: list[int]) -> list[BlockHash]:
        """Hashes of the full blocks of a bare token list (no extra keys)."""
        from hybridkv.request import Request

        req = Request("hash_tokens", token_ids)
        self.update(req)
        return list(req._block_hashes)
