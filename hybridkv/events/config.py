"""``KVEventsConfig``: where and how KV cache events are published.

Field names and defaults follow vLLM 0.33's ``KVEventsConfig`` (``endpoint``,
``replay_endpoint``, ``buffer_steps``, ``hwm``, ``max_queue_size``, ``topic``);
``int_block_hashes`` is vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (on by
default there too) and ``medium`` its block pool's ``medium``. Pure data: no
ZeroMQ here, so importing it costs nothing.

Endpoints follow vLLM's rule: the publisher *binds* an endpoint with a
wildcard (``tcp://*:5557``, ``tcp://127.0.0.1:*``) or an ``ipc://`` /
``inproc://`` one, and *connects* to any other (``tcp://127.0.0.1:5557``
reaches a subscriber that bound that port, the way llm-d's indexer listens).
The replay endpoint is always bound.

One departure, for safety: a wildcard *host* (``tcp://*:5557``,
``tcp://[::]:5557``) binds ``bind_host``, loopback unless told otherwise
(``bind_host="*"`` binds every interface, vLLM's meaning). A subscriber
learns every cached block's token ids, so the events of a server bound to
every interface publish its users' prompts to anyone who reaches the port.
"""

from __future__ import annotations

from dataclasses import dataclass

#: vLLM's ``MEDIUM_*`` values for the storage tier that holds the blocks.
MEDIA = ("GPU", "CPU", "STORAGE")


def is_bind_endpoint(endpoint: str) -> bool:
    """Whether the publisher binds ``endpoint`` (else it connects), as vLLM decides."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


#: Hosts that mean "every interface" in a bound endpoint.
WILDCARD_HOSTS = ("*", "[::]")


def bind_address(endpoint: str, bind_host: str) -> str:
    """What the publisher binds for the bind ``endpoint``: a wildcard host is
    replaced by ``bind_host`` unless that is ``"*"`` (``tcp://*:5557`` ->
    ``tcp://127.0.0.1:5557``); any other endpoint as it is."""
    if bind_host == "*" or not endpoint.startswith("tcp://"):
        return endpoint
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    return f"tcp://{bind_host}:{port}" if sep and host in WILDCARD_HOSTS else endpoint


def _check_endpoint(value: str, field: str) -> None:
    if not isinstance(value, str) or not value.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(
            f"{field} must be a ZeroMQ endpoint such as 'tcp://127.0.0.1:5557', got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """How to publish BlockStored / BlockRemoved / AllBlocksCleared batches over ZMQ."""

    endpoint: str = "tcp://*:5557"
    """PUB socket: bound when it has a wildcard (or is ipc/inproc), else connected."""
    replay_endpoint: str | None = None
    """ROUTER socket (always bound) answering replay requests; None: no replay."""
    topic: str = ""
    """First frame of every message; subscribers filter on its prefix."""
    buffer_steps: int = 10_000
    """Batches kept for replay (the oldest are dropped first)."""
    hwm: int = 100_000
    """PUB send high-water mark: messages beyond it are dropped for slow subscribers."""
    max_queue_size: int = 100_000
    """Batches waiting for the publisher thread; ``publish`` blocks when full."""
    int_block_hashes: bool = True
    """Send each hash as the uint64 of its last 8 bytes (vLLM's default), else raw bytes."""
    medium: str | None = None
    """Storage tier reported in events; None: "GPU" on a CUDA device, else "CPU"."""
    bind_host: str = "127.0.0.1"
    """The interface a wildcard-host endpoint binds (module docstring); "*": every one."""

    def __post_init__(self) -> None:
        _check_endpoint(self.endpoint, "endpoint")
        if self.replay_endpoint is not None:
            _check_endpoint(self.replay_endpoint, "replay_endpoint")
            if self.replay_endpoint == self.endpoint and "*" not in self.endpoint:
                raise ValueError("replay_endpoint must differ from endpoint")
        if not isinstance(self.topic, str):
            raise ValueError(f"topic must be a str, got {self.topic!r}")
        for field in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if not isinstance(self.bind_host, str) or not self.bind_host.strip():
            raise ValueError(
                f"bind_host must be an interface address such as '127.0.0.1' (or '*' for "
                f"every interface), got {self.bind_host!r}"
            )
        if self.medium is not None and self.medium not in MEDIA:
            raise ValueError(f"medium must be one of {MEDIA} or None, got {self.medium!r}")


def resolve_events_config(
    config: KVEventsConfig | None,
    endpoint: str | None,
    replay_endpoint: str | None,
    topic: str | None,
) -> KVEventsConfig | None:
    """The config from either a whole ``KVEventsConfig`` or the three shorthand
    options (``LLM``'s ``kv_events_*`` arguments); None when events are off.
    """
    shorthand = {
        "kv_events_endpoint": endpoint,
        "kv_events_replay_endpoint": replay_endpoint,
        "kv_events_topic": topic,
    }
    given = [name for name, value in shorthand.items() if value is not None]
    if config is not None:
        if not isinstance(config, KVEventsConfig):
            raise ValueError(f"kv_events_config must be a KVEventsConfig, got {config!r}")
        if given:
            raise ValueError(f"pass kv_events_config or {', '.join(given)}, not both")
        return config
    if endpoint is None:
        if given:
            raise ValueError(f"{', '.join(given)} needs kv_events_endpoint")
        return None
    return KVEventsConfig(endpoint=endpoint, replay_endpoint=replay_endpoint, topic=topic or "")
