"""``StoreURL``: where a Mooncake Store is and how this replica joins it, from one URL.

::

    mooncake://MASTER_HOST:PORT?metadata=http://HOST:PORT/metadata&segment=4GiB

``LLM(kv_store=URL)`` and ``hybridkv serve --kv-store URL`` take the same string.
Query fields (each optional):

==========  =================================  ========================================
field       meaning                            default
==========  =================================  ========================================
metadata    the transfer engine's metadata     ``http://MASTER_HOST:8080/metadata`` (the
            server (``http://...``)            master's ``--enable_http_metadata_server``)
segment     bytes this replica lends to the    ``1GiB`` (at least ``16MiB``)
            shared store (its share of the
            pool; gone when the replica stops)
buffer      the client's local transfer        ``256MiB``
            buffer
queue       bytes of writes waiting to be      ``256MiB`` (past it, writes are skipped
            sent (copies taken at the step;    and counted, never waited for)
            registered staging memory with
            ``zerocopy=1``)
staging     registered memory the loads are    ``64MiB`` (a batch larger is read in
            read into (``zerocopy=1``)         rounds; a unit larger is a miss)
zerocopy    ``1``: puts and gets go through    ``1``
            registered staging memory
            (``store_staging.py``); ``0``:
            puts from private copies, gets
            as bytes (the copying path)
protocol    ``tcp`` or ``rdma``                ``tcp``
device      RDMA device names (``rdma``)       empty
local       the address other replicas reach   ``127.0.0.1`` for a loopback master,
            this one at (its segment)          else this host's name
sweep       seconds between checks of the      ``5`` (``0``: off; evictions are then
            objects this replica wrote (for    seen only by lookups and loads)
            ``BlockRemoved``: ``store_watch``)
optional    ``1``: a store that cannot be      ``0`` (a store that cannot be reached
            reached at start is a warning;     at start is a ``TierError`` naming it)
            the replica starts without it
            and joins it in the background
finish      how long a finished request's      ``1s`` (``250ms``, ``0.5``: seconds;
            output waits for the store writes  ``0``: it does not wait)
            in flight (``write_barrier``), so
            a next turn on any replica finds
            them
==========  =================================  ========================================

Sizes take ``parse_memory``'s forms (``4GiB``, ``512MiB``, a byte count). A bad
URL is a ``TierError`` (a ``ValueError``) naming the field and the fix.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from hybridkv.report.units import parse_memory
from hybridkv.tiers.base import TierError

SCHEME = "mooncake"
DEFAULT_PORT = 50051
#: The smallest segment the Mooncake client accepts (measured: 8 MiB fails, code -600).
MIN_SEGMENT = 16 << 20
_SIZES = {"segment": "1GiB", "buffer": "256MiB", "queue": "256MiB", "staging": "64MiB"}
_FIELDS = {
    "metadata",
    "protocol",
    "device",
    "local",
    "sweep",
    "optional",
    "finish",
    "zerocopy",
    *_SIZES,
}
#: Seconds between two sweeps of the watched keys, by default (``store_watch.py``).
DEFAULT_SWEEP = 5.0
#: ``finish``'s default (seconds). A put of one request's units takes milliseconds on a
#: loopback or data-centre network (about 10 ms per MiB over tcp on a loaded 2-core box);
#: a second means the store is slow or gone, and an output should not wait on it longer.
DEFAULT_FINISH = "1s"
#: The longest ``finish`` wait accepted (seconds): past it a store is not worth waiting on.
MAX_FINISH = 60.0
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed ``kv_store`` URL (module docstring); sizes in bytes."""

    host: str
    port: int
    metadata: str
    segment: int
    buffer: int
    queue: int
    protocol: str = "tcp"
    device: str = ""
    local: str = "127.0.0.1"
    sweep: float = DEFAULT_SWEEP
    optional: bool = False
    finish: float = 1.0
    staging: int = 64 << 20
    zerocopy: bool = True

    @property
    def master(self) -> str:
        """``HOST:PORT`` of ``mooncake_master``."""
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{SCHEME}://{self.master}?metadata={self.metadata}"


def _error(url: str, what: str) -> TierError:
    return TierError(f"kv_store {url!r}: {what}")


def parse_store_url(url: str) -> StoreURL:
    """The ``StoreURL`` of ``url`` (module docstring), or ``TierError`` naming the field."""
    if not isinstance(url, str) or not url:
        raise TierError(f"kv_store must be a URL string like {SCHEME}://HOST:PORT, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise _error(url, f"the scheme must be {SCHEME}:// (e.g. {SCHEME}://127.0.0.1:50051)")
    if parts.path not in ("", "/") or parts.fragment:
        raise _error(url, "give only HOST:PORT and ?fields after the scheme")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise _error(url, "the port must be a number from 1 to 65535") from None
    if not host:
        raise _error(url, "the master's HOST is missing (mooncake://HOST:PORT)")
    fields: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name not in _FIELDS:
            raise _error(url, f"unknown field {name!r}; the fields are {sorted(_FIELDS)}")
        if name in fields:
            raise _error(url, f"field {name!r} is given twice")
        fields[name] = value
    sizes: dict[str, int] = {}
    for name, default in _SIZES.items():
        try:
            sizes[name] = parse_memory(fields.get(name, default))
        except ValueError as e:
            raise _error(url, f"field {name!r}: {e}") from None
    if sizes["segment"] < MIN_SEGMENT:
        raise _error(url, "field 'segment' must be at least 16MiB (the store's smallest)")
    metadata = fields.get("metadata", f"http://{host}:8080/metadata")
    if not metadata.startswith(("http://", "https://")):
        raise _error(url, f"field 'metadata' must be an http:// URL, got {metadata!r}")
    protocol = fields.get("protocol", "tcp")
    if protocol not in ("tcp", "rdma"):
        raise _error(url, f"field 'protocol' must be 'tcp' or 'rdma', got {protocol!r}")
    try:
        sweep = float(fields.get("sweep", DEFAULT_SWEEP))
    except ValueError:
        sweep = -1.0
    if not sweep >= 0 or sweep == float("inf"):
        raise _error(url, f"field 'sweep' must be seconds >= 0 (0: off), got {fields['sweep']!r}")
    optional = fields.get("optional", "0")
    if optional not in ("0", "1"):
        raise _error(url, f"field 'optional' must be 0 or 1, got {optional!r}")
    zerocopy = fields.get("zerocopy", "1")
    if zerocopy not in ("0", "1"):
        raise _error(url, f"field 'zerocopy' must be 0 or 1, got {zerocopy!r}")
    local = fields.get("local") or ("127.0.0.1" if host in _LOOPBACK else socket.gethostname())
    finish = _seconds(url, fields.get("finish", DEFAULT_FINISH))
    return StoreURL(
        host=host,
        port=port or DEFAULT_PORT,
        metadata=metadata,
        protocol=protocol,
        device=fields.get("device", ""),
        local=local,
        sweep=sweep,
        optional=optional == "1",
        finish=finish,
        zerocopy=zerocopy == "1",
        **sizes,
    )


def _seconds(url: str, text: str) -> float:
    """``finish``'s value: ``250ms``, ``1s`` or a number of seconds, 0 to ``MAX_FINISH``."""
    scale = 1e-3 if text.endswith("ms") else 1.0
    try:
        value = float(text.removesuffix("ms").removesuffix("s")) * scale
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_FINISH:  # NaN fails too
        raise _error(url, f"field 'finish' must be 0 to 60 seconds (1s, 250ms), got {text!r}")
    return value
