"""``StoreClient``: this process's Mooncake Store client, and whether the store is there.

Joining (``connect``): the master's port and the metadata server are probed
first (``PROBE_SECONDS`` each), so that a store that cannot be reached is one
``TierError`` naming its address at once (the client's own set-up retries for
about 90 s); then ``MooncakeDistributedStore.setup`` lends this replica's
``segment`` to the shared pool. With the URL's ``optional=1`` a store that
cannot be reached is instead one warning naming it: the client starts *off*
(every call a miss, as in an outage) and a thread of its own tries to join
again every ``JOIN_RETRY_SECONDS``; once it has, one line says so and
``epoch`` grows. The ``mooncake`` package is imported here, on first use (the
``store`` extra), never by ``import hybridkv``.

Health: ``healthy()`` reads the client's own view (``health_check``, no
request). While the master is gone every call here answers at once as a miss
(``exists``: False; ``get``: None; ``put``: ``UNREACHABLE``) without asking,
and one warning is logged per outage, not one per request; when the master is
back (the client re-registers its segment by itself) one line says so and
``epoch`` grows (what the old master held is gone: callers drop what they
remember of it). A request already on its way when the master dies waits for
the client's RPC timeout (about 4 s here) and then fails like a miss.

Thread-safety: the Mooncake client takes calls from several threads; this
wrapper's own state is behind a lock.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from hybridkv.common.env import quiet_mooncake
from hybridkv.common.extras import require
from hybridkv.tiers.base import TierError, TierFullError
from hybridkv.tiers.store_url import StoreURL

logger = logging.getLogger("hybridkv.tiers")

#: How long joining waits for the master's port and the metadata server, each.
PROBE_SECONDS = 3.0
#: How often a store that was not there at start (``optional=1``) is tried again.
JOIN_RETRY_SECONDS = 5.0
#: ``put`` codes: stored; not stored because the store had no room (its
#: ``NO_AVAILABLE_HANDLE``); not asked because the master is unreachable.
OK, NO_ROOM, UNREACHABLE = 0, -200, -1


def put_error(code: int) -> OSError | None:
    """The error of a ``put`` code (None: ``OK``): ``TierFullError`` for ``NO_ROOM``,
    ``ConnectionError`` for ``UNREACHABLE``, else ``OSError`` naming it."""
    if code == OK:
        return None
    if code == NO_ROOM:
        return TierFullError(f"STORE tier: the store had no room ({code})")
    if code == UNREACHABLE:
        return ConnectionError("STORE tier: the store is unreachable")
    return OSError(f"STORE tier: put failed with code {code}")


class StoreUnreachable(TierError):
    """The store's master or metadata server did not answer (``probe``)."""


def probe(url: StoreURL) -> None:
    """``StoreUnreachable`` naming the address unless the master and metadata server
    answer."""
    try:
        socket.create_connection((url.host, url.port), timeout=PROBE_SECONDS).close()
    except OSError as e:
        raise StoreUnreachable(
            f"kv_store: the Mooncake master at {url.master} cannot be reached ({e}); "
            "start mooncake_master there or fix the URL"
        ) from None
    try:
        urllib.request.urlopen(f"{url.metadata}?key=hybridkv-probe", timeout=PROBE_SECONDS)
    except urllib.error.HTTPError:
        pass  # it answered (404: no such key): it is there
    except (OSError, ValueError) as e:
        raise StoreUnreachable(
            f"kv_store: the metadata server {url.metadata} cannot be reached ({e}); start "
            "mooncake_master with --enable_http_metadata_server=true or fix 'metadata'"
        ) from None


class StoreClient:
    """One Mooncake Store client (module docstring)."""

    def __init__(self, url: StoreURL, store: Any) -> None:
        """``store``: the joined Mooncake client, or None (not joined: ``connect``)."""
        self.url = url
        self._store = store
        self._lock = threading.Lock()
        self._up = store is not None
        #: Grows each time the store comes back after an outage (or is joined late).
        self.epoch = 0
        self.outages = 0
        self._closed = False
        self._stop = threading.Event()
        self._joiner: threading.Thread | None = None
        self._buffers: dict[int, int] = {}  # registered memory: address -> size

    @classmethod
    def connect(cls, url: StoreURL) -> StoreClient:
        """Join the store at ``url``: ``TierError`` naming the address if it cannot,
        unless ``url.optional`` (then a client that joins later: module docstring)."""
        try:
            return cls(url, cls.join(url))
        except StoreUnreachable as e:  # a set-up that fails once it is there: an error
            if not url.optional:
                raise
            logger.warning(
                "%s; starting without the store (optional=1): its lookups are misses and "
                "its writes are skipped until it answers (tried again every %g s)",
                e,
                JOIN_RETRY_SECONDS,
            )
        client = cls(url, None)
        client._joiner = threading.Thread(
            target=client._join_later, name="hybridkv-store-join", daemon=True
        )  # daemon: it holds no data; close() stops it and waits for it
        client._joiner.start()
        return client

    def _join_later(self) -> None:
        """The joiner thread: try again until joined or closed."""
        while not self._stop.wait(JOIN_RETRY_SECONDS):
            try:
                store = self.join(self.url)
            except StoreUnreachable:
                continue
            except TierError as e:  # there, but this replica cannot join it as configured
                logger.warning("%s; the store stays off", e)
                return
            with self._lock:
                if not self._closed:
                    for address, size in self._buffers.items():
                        _register(store, address, size)
                    self._store, store = store, None
            if store is not None:  # closed meanwhile: leave at once
                store.close()
            return

    @staticmethod
    def join(url: StoreURL) -> Any:
        """Probe, then set up a Mooncake client of ``url`` (``TierError`` naming the
        address or the field when it cannot)."""
        quiet_mooncake()
        store_module = require("mooncake.store", "store", "kv_store")  # the extra first
        probe(url)
        store = store_module.MooncakeDistributedStore()
        rc = store.setup(
            url.local,
            url.metadata,
            url.segment,
            url.buffer,
            url.protocol,
            url.device,
            url.master,
        )
        if rc != 0:
            raise TierError(
                f"kv_store: joining the Mooncake Store at {url.master} failed (code {rc}); "
                "check that the master and metadata server are the store's and that "
                f"'local' ({url.local}) is this host's address"
            )
        return store

    @property
    def joined(self) -> bool:
        """False while a store that was not there at start has not been joined."""
        return self._store is not None

    def healthy(self) -> bool:
        """True while the master answers (the client's view; no request sent)."""
        store = self._store
        up = not self._closed and store is not None and store.health_check() == 0
        with self._lock:
            if up == self._up:
                return up
            self._up = up
            if up:
                self.epoch += 1
        if up:
            again = "is reachable again" if self.outages else "is joined: the store is on"
            logger.info("Mooncake Store at %s %s", self.url.master, again)
        else:
            self.outages += 1
            logger.warning(
                "Mooncake Store at %s is unreachable: its reads are misses (recomputed) "
                "and its writes are skipped until it is back (counted, not logged again)",
                self.url.master,
            )
        return up

    def exists(self, names: Sequence[str]) -> list[bool]:
        """Which objects the store holds now (all False while it is unreachable)."""
        return [there is True for there in self.lookup(names)]

    def lookup(self, names: Sequence[str]) -> list[bool | None]:
        """Per object: True held, False not held, None not known (the store is
        unreachable, or answered this name with an error)."""
        if not names or not self.healthy():
            return [None] * len(names)
        codes = self._store.batch_is_exist(list(names))
        return [True if code == 1 else False if code == 0 else None for code in codes]

    def put(self, names: Sequence[str], buffers: Sequence[Any]) -> list[int]:
        """Store each buffer (a writable, C-contiguous byte buffer) under its name;
        one code per name (``OK``, ``NO_ROOM``, ``UNREACHABLE``, or the store's error).
        The buffers need not be registered: the client reads them in place over ``tcp``
        (the copying path, ``zerocopy=0``; over RDMA only registered memory works)."""
        ptrs, sizes = [], []
        for buf in buffers:
            view = memoryview(buf)
            ptrs.append(_address(view))
            sizes.append(view.nbytes)
        return self.put_from(names, ptrs, sizes)

    def get(self, names: Sequence[str]) -> list[bytes | None]:
        """Each object's bytes, or None (not held, or the store unreachable)."""
        if not names:
            return []
        if not self.healthy():
            return [None] * len(names)
        return [data or None for data in self._store.get_batch(list(names))]

    def register(self, address: int, size: int) -> None:
        """Register ``size`` bytes at ``address`` for ``put_from`` / ``get_into`` (now if
        joined, else when the store is joined); ``TierError`` if the client refuses."""
        with self._lock:
            assert address not in self._buffers, "memory registered twice"
            self._buffers[address] = size
            if self._store is not None:
                _register(self._store, address, size)

    def unregister(self, address: int) -> None:
        """Undo ``register`` (the memory may be freed after this returns)."""
        with self._lock:
            self._buffers.pop(address)
            if self._store is not None and not self._closed:
                self._store.unregister_buffer(address)

    @property
    def registered(self) -> dict[int, int]:
        """The memory registered now: address -> size."""
        with self._lock:
            return dict(self._buffers)

    def put_from(
        self, names: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Store ``sizes[i]`` bytes of registered memory at ``ptrs[i]`` under each name
        (zero-copy); codes as ``put``'s."""
        if not names:
            return []
        if not self.healthy():
            return [UNREACHABLE] * len(names)
        return list(self._store.batch_put_from(list(names), list(ptrs), list(sizes)))

    def get_into(
        self, names: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Read each object into registered memory at ``ptrs[i]`` (room for ``sizes[i]``
        bytes; zero-copy): per name its length, or a negative code (not held, larger
        than its room, or ``UNREACHABLE``)."""
        if not names:
            return []
        if not self.healthy():
            return [UNREACHABLE] * len(names)
        return list(self._store.batch_get_into(list(names), list(ptrs), list(sizes)))

    def sizes(self, names: Sequence[str]) -> list[int]:
        """Each object's length, or a negative code (not held; unreachable): one request
        per name (the client has no batched form)."""
        if not self.healthy():
            return [UNREACHABLE] * len(names)
        return [self._store.get_size(name) for name in names]

    def remove(self, name: str, force: bool = False) -> bool:
        """Drop ``name`` from the store (False: not held, being read, or unreachable).
        ``force``: even while a lease holds it (a corrupt entry: no reader can use it)."""
        return self.healthy() and self._store.remove(name, force) == 0

    def close(self) -> None:
        """Leave the store (this replica's segment and what it held go with it); stop
        trying to join it (waits for a try under way: a probe, at most seconds)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._joiner is not None:
            self._joiner.join()
        if self._store is not None:
            for address in self._buffers:  # left registered by a tier not closed first
                self._store.unregister_buffer(address)
            self._store.close()


def _register(store: Any, address: int, size: int) -> None:
    rc = store.register_buffer(address, size)
    if rc != 0:
        raise TierError(f"kv_store: registering {size} bytes of staging memory failed (code {rc})")


def _address(view: memoryview) -> int:
    """The address of a writable, contiguous buffer's first byte."""
    import ctypes

    if view.readonly or not view.c_contiguous:
        raise ValueError("store buffers must be writable and contiguous")
    return ctypes.addressof(ctypes.c_char.from_buffer(view))
