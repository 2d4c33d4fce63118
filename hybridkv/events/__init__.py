"""KV cache events in vLLM 0.33's wire format, published over ZeroMQ.

``open_publisher(config, kv_cache_config, device_type)`` starts a
``ZmqEventPublisher`` (``publisher.py``) that sends what
``KVCacheManager.take_events()`` returns as msgpack batches a consumer written
for vLLM's ``ZmqEventPublisher`` decodes unchanged (``wire.py``), with vLLM's
group fields for hybrid models (``groups.py``). ``LLM(kv_events_endpoint=...)``
does this after every engine step (docs/kv_events.md).

Only this module's configuration is imported eagerly: ``pyzmq`` and
``msgspec`` (the ``events`` extra) load when a publisher is opened, and a
missing one raises an ``ImportError`` that names the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridkv.common.extras import install_command
from hybridkv.events.config import KVEventsConfig, is_bind_endpoint
from hybridkv.events.groups import GroupEventInfo, external_hash, group_event_infos

if TYPE_CHECKING:
    from hybridkv.events.publisher import ZmqEventPublisher
    from hybridkv.specs import KVCacheConfig

EXTRA_HINT = install_command("events")
_OPTIONAL = ("zmq", "msgspec")


def open_publisher(
    config: KVEventsConfig, kv_cache_config: KVCacheConfig, device_type: str
) -> ZmqEventPublisher:
    """Bind/connect the sockets and start the publisher thread.

    ``device_type`` (``"cuda"``, ``"cpu"``...) picks the reported medium when
    ``config.medium`` is None: ``"GPU"`` on CUDA, else ``"CPU"``.
    """
    try:
        from hybridkv.events.publisher import ZmqEventPublisher
    except ImportError as e:
        if e.name not in _OPTIONAL:
            raise
        raise ImportError(
            f"KV events need pyzmq and msgspec ({e.name!r} is missing): {EXTRA_HINT}"
        ) from e
    medium = config.medium or ("GPU" if device_type == "cuda" else "CPU")
    return ZmqEventPublisher(config, group_event_infos(kv_cache_config), medium)


__all__ = [
    "EXTRA_HINT",
    "GroupEventInfo",
    "KVEventsConfig",
    "external_hash",
    "group_event_infos",
    "is_bind_endpoint",
    "open_publisher",
]
