"""Build an engine's ``TieredCache`` from its ``CacheConfig`` (the tier fields).

The tiers' ``ModelFingerprint`` names the weights by ``weights_identity``:
sha256 over each weight file's name, size, safetensors header and 16 chunks
of 64 KiB spread over its bytes (reading every byte of a large checkpoint at
each start would cost seconds; two checkpoints that differ only outside the
sampled chunks would share an identity: a fine-tune changes every tensor).
Its layout names the unit byte layout (``BlockBytes``: one part per layer)
and the kernel backend (whose numerics wrote the bytes).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

import torch

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.offload.tier_ranking import tier_rules
from hybridkv.offload.tiered_cache import TieredCache
from hybridkv.planning import KVCacheBuffers
from hybridkv.policy import HybridOptions
from hybridkv.policy.options import for_host_tier
from hybridkv.specs import KVCacheConfig
from hybridkv.tiers import DiskTier, HostTier, ModelFingerprint, MooncakeTier
from hybridkv.tiers.disk_dir import check_writable
from hybridkv.tiers.fingerprint import UNIT_LAYOUT
from hybridkv.tiers.memory import HostMemory
from hybridkv.tiers.slab_memory import SlabMemory
from hybridkv.tiers.torch_memory import TorchHostMemory

GIB = 1 << 30
#: ``BlockBytes``' unit layout; change it when that layout changes.
ENGINE_UNIT_LAYOUT = f"{UNIT_LAYOUT}+layer-pages/v1"
_CHUNKS, _CHUNK = 16, 64 << 10


def weights_identity(model_dir: Path) -> str:
    """A stable identity of the checkpoint's weights (module docstring)."""
    h = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    for path in files:
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            h.update(head + f.read(min(n, 1 << 24)))
            for k in range(_CHUNKS):
                f.seek(size * k // _CHUNKS)
                h.update(f.read(_CHUNK))
    return h.hexdigest()


def check_disk_cache_dir(disk_cache_dir: str | os.PathLike[str] | None) -> None:
    """``TierError`` (a ``ValueError``) naming ``disk_cache_dir`` if it cannot be written."""
    if disk_cache_dir is not None:
        check_writable(Path(disk_cache_dir))


def check_kv_store(kv_store: str | None) -> None:
    """``TierError`` (a ``ValueError``) naming the address if the store at ``kv_store``
    cannot be reached (checked in a few seconds, before any weight is read); with
    the URL's ``optional=1`` nothing is checked here: the engine starts without an
    unreachable store, saying so (``StoreClient.connect``)."""
    if kv_store is not None:
        from hybridkv.tiers.store_client import probe
        from hybridkv.tiers.store_url import parse_store_url

        url = parse_store_url(kv_store)
        if not url.optional:
            probe(url)


class TierSettings(Protocol):
    """The tier fields of the engine's ``CacheConfig`` (checked there), in GiB."""

    @property
    def kv_offloading_size(self) -> float | None: ...
    @property
    def disk_cache_dir(self) -> str | os.PathLike[str] | None: ...
    @property
    def disk_cache_size(self) -> float | None: ...
    @property
    def kv_store(self) -> str | None: ...


def check_tier_settings(settings: TierSettings) -> None:
    """``check_disk_cache_dir`` and ``check_kv_store`` of ``settings``: one-line
    ``TierError``s before any weight is read."""
    check_disk_cache_dir(settings.disk_cache_dir)
    check_kv_store(settings.kv_store)


class PolicySettings(TierSettings, Protocol):
    """The cache policy fields of the engine's ``CacheConfig``, with the tier fields."""

    @property
    def cache_policy(self) -> str: ...
    @property
    def hybrid(self) -> HybridOptions | None: ...


def hybrid_with_tiers(settings: PolicySettings, device_bytes: int) -> HybridOptions | None:
    """The ``hybrid`` options for a device pool of ``device_bytes`` under these tiers:
    with a host tier, the policy's memory of seen prompts covers device and host
    (``policy.options.for_host_tier``, as ``hybridkv simulate --host-memory`` does);
    without one, or under ``lru``, ``settings.hybrid`` unchanged."""
    if settings.kv_offloading_size is None or settings.cache_policy != "hybrid":
        return settings.hybrid
    return for_host_tier(settings.hybrid, device_bytes, int(settings.kv_offloading_size * GIB))


def build_tiered_cache(
    settings: TierSettings,
    manager: KVCacheManager,
    buffers: KVCacheBuffers,
    model_dir: Path,
    backend: str,
) -> TieredCache | None:
    """The tiers under ``manager``'s pool (None without ``kv_offloading_size`` and
    ``kv_store``). On CUDA a step waits for loads on the current stream
    (``StreamOrder``)."""
    kv_offloading_size = settings.kv_offloading_size
    disk_cache_dir, disk_cache_size = settings.disk_cache_dir, settings.disk_cache_size
    if kv_offloading_size is None and settings.kv_store is None:
        return None
    config: KVCacheConfig = manager.kv_cache_config
    fingerprint = ModelFingerprint.from_kv_cache_config(
        config, weights_identity(model_dir), f"{ENGINE_UNIT_LAYOUT}+{backend}"
    )
    host_rule, disk_rule = tier_rules(manager) or (None, None)
    device = buffers.buffers[0].device if buffers.buffers else torch.device("cpu")
    block_bytes = BlockBytes(config, buffers)
    host = disk = store = None
    try:
        if kv_offloading_size is not None:
            budget = int(kv_offloading_size * GIB)
            # On the CPU a slab of slots, copied by rows in batches; on CUDA pinned buffers.
            memory: HostMemory = (
                SlabMemory(block_bytes.widths, budget)
                if block_bytes.has_rows
                else TorchHostMemory(device)
            )
            host = HostTier(fingerprint, budget, memory, host_rule)
        if disk_cache_dir is not None:
            assert disk_cache_size is not None
            disk = DiskTier(
                fingerprint, disk_cache_dir, int(disk_cache_size * GIB), ranking=disk_rule
            )
        if settings.kv_store is not None:
            store = MooncakeTier.connect(fingerprint, settings.kv_store)
    except BaseException:
        for tier in (host, disk):
            if tier is not None:
                tier.close()
        raise
    order = StreamOrder()
    if device.type == "cuda":
        order = StreamOrder(lambda: torch.cuda.current_stream(device))
    return TieredCache(manager, block_bytes, host, disk, order, store=store)
