"""A request's blocks filled with known bytes: what the tier tests compare against."""

from __future__ import annotations

from typing import Any

import torch
from factories import admit

from hybridkv import KVCacheManager, Request
from hybridkv.offload import BlockBytes


def fill_and_free(kv: KVCacheManager, block_bytes: BlockBytes, r: Request) -> dict[Any, bytes]:
    """Admit ``r``, fill its blocks with random bytes, free it; the cached blocks'
    bytes by ``(group, block hash)``."""
    admit(kv, r)
    out = {}
    gen = torch.Generator().manual_seed(0)
    for gid, table in enumerate(kv.get_blocks(r.request_id).blocks):
        for b in table:
            if b.is_null:
                continue
            parts = block_bytes.parts(gid, b.block_id)
            for p in parts:
                p.copy_(torch.randint(0, 256, p.shape, dtype=torch.uint8, generator=gen))
            if b.block_hash is not None:
                out[(gid, b.block_hash)] = b"".join(bytes(p.numpy()) for p in parts)
    kv.free(r)
    return out
