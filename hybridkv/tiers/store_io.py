"""How the store tier's objects travel: through registered staging memory, or copied.

``MooncakeTier`` builds each object in memory one of these gives it, puts a
batch of them, and reads a batch back; one object per URL's ``zerocopy``
(chosen once, in ``store_io``), used the same way by the tier:

- ``StagedIO`` (``zerocopy=1``, the default): a ``StagingRegion`` registered
  with the client. A write's object is assembled in its write part (one copy
  from the pool rows) and put from there (``batch_put_from``, zero-copy); a
  load batch is read into its read part (``batch_get_into``, zero-copy),
  checked there and scattered from there into the pool rows (one copy).
- ``CopyingIO`` (``zerocopy=0``): a write's object is a ``bytearray`` of its
  own, put from there (unregistered memory: works over ``tcp`` only); a load
  batch is one ``get_batch``, which the client copies out of its own transfer
  buffer into ``bytes`` objects (one copy more than ``StagedIO``).

Contracts: ``stage`` answers None when there is no room (the caller skips the
write, counted; it is never waited for); ``put`` gives every staged object
back, whatever its outcome. ``read`` yields ``(index, data)`` per name, where
``data`` is the object's bytes or a negative code (not held: ``MISSING``; too
large for its room: ``TOO_LARGE``; no staging room: ``NO_STAGING``;
``UNREACHABLE``); a yielded view is valid only until the next item is asked
for (staging is reused).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from hybridkv.tiers.store_client import UNREACHABLE, StoreClient
from hybridkv.tiers.store_staging import StagingRegion

#: ``read`` codes besides ``UNREACHABLE`` (-1): the object is not held (the client's
#: ``OBJECT_NOT_FOUND``); it is larger than the room its expected size gave it (the
#: client answers ``INVALID_PARAMS`` then, measured with 0.3.13); the read part
#: cannot hold it at all (ours; below the client's codes).
MISSING, TOO_LARGE, NO_STAGING = -704, -600, -100_000


class Staged:
    """One object built for a put: ``view`` (writable, ``nbytes`` long) and where it is."""

    __slots__ = ("nbytes", "offset", "view")

    def __init__(self, view: memoryview, offset: int | None) -> None:
        self.view = view
        self.nbytes = view.nbytes
        self.offset = offset  # in the staging region; None for a private copy

    def fill(self, header: bytes, parts: Sequence[memoryview]) -> None:
        """Write the entry: ``header``, then ``parts`` back to back (``nbytes`` in all)."""
        buf = self.view
        buf[: len(header)] = header
        at = len(header)
        for p in parts:
            buf[at : at + p.nbytes] = p
            at += p.nbytes
        assert at == self.nbytes, (at, self.nbytes)


class StoreIO(Protocol):
    """How objects travel (module docstring)."""

    zero_copy: bool

    def stage(self, nbytes: int) -> Staged | None: ...

    def put(self, names: Sequence[str], staged: Sequence[Staged]) -> list[int]: ...

    def release(self, staged: Sequence[Staged]) -> None: ...

    def read(
        self, names: Sequence[str], sizes: Sequence[int | None]
    ) -> Iterator[tuple[int, memoryview | int]]: ...

    def check_integrity(self) -> None: ...

    def close(self) -> None: ...


class CopyingIO:
    """Private copies out, ``bytes`` in (module docstring)."""

    zero_copy = False

    def __init__(self, client: StoreClient) -> None:
        self.client = client

    def stage(self, nbytes: int) -> Staged | None:
        return Staged(memoryview(bytearray(nbytes)), None)

    def put(self, names: Sequence[str], staged: Sequence[Staged]) -> list[int]:
        return self.client.put(names, [s.view for s in staged])

    def release(self, staged: Sequence[Staged]) -> None:
        pass  # the garbage collector frees the copies

    def read(
        self, names: Sequence[str], sizes: Sequence[int | None]
    ) -> Iterator[tuple[int, memoryview | int]]:
        up = self.client.healthy()
        for i, data in enumerate(self.client.get(names)):
            yield i, (memoryview(data) if data is not None else MISSING if up else UNREACHABLE)

    def check_integrity(self) -> None:
        pass

    def close(self) -> None:
        pass


class StagedIO:
    """Registered staging memory both ways (module docstring)."""

    zero_copy = True

    def __init__(self, client: StoreClient, write_bytes: int, read_bytes: int) -> None:
        self.client = client
        self.region = StagingRegion(write_bytes, read_bytes)
        client.register(self.region.address, self.region.nbytes)

    def stage(self, nbytes: int) -> Staged | None:
        offset = self.region.writes.take(nbytes)
        return None if offset is None else Staged(self.region.at(offset, nbytes), offset)

    def put(self, names: Sequence[str], staged: Sequence[Staged]) -> list[int]:
        base = self.region.address
        try:
            return self.client.put_from(
                names,
                [base + s.offset for s in staged],  # type: ignore[operator]
                [s.nbytes for s in staged],
            )
        finally:
            self.release(staged)

    def release(self, staged: Sequence[Staged]) -> None:
        for s in staged:
            if s.offset is not None:
                s.view.release()
                self.region.writes.give(s.offset)
                s.offset = None

    def read(
        self, names: Sequence[str], sizes: Sequence[int | None]
    ) -> Iterator[tuple[int, memoryview | int]]:
        """In rounds: as many objects as the read part holds at once, each given the
        room of its expected size (``None``: asked of the store first)."""
        wanted = list(sizes)
        unknown = [i for i, n in enumerate(wanted) if n is None]
        if unknown:
            for i, n in zip(unknown, self.client.sizes([names[i] for i in unknown]), strict=True):
                wanted[i] = n
        reads = self.region.reads
        todo = list(range(len(names)))
        while todo:
            batch: list[tuple[int, int, int]] = []  # (index, offset, room)
            rest: list[int] = []
            for i in todo:
                room = wanted[i]
                if room is None or room < 0:
                    yield i, (room if room is not None and room < 0 else MISSING)
                    continue
                offset = reads.take(room)
                if offset is not None:
                    batch.append((i, offset, room))
                elif batch:  # no room until this round's objects are given back
                    rest.append(i)
                else:  # larger than the whole read part
                    yield i, NO_STAGING
            base = self.region.address
            try:
                codes = self.client.get_into(
                    [names[i] for i, _, _ in batch],
                    [base + offset for _, offset, _ in batch],
                    [room for _, _, room in batch],
                )
                for (i, offset, _), code in zip(batch, codes, strict=True):
                    if code < 0:
                        yield i, code  # MISSING, TOO_LARGE, UNREACHABLE or another
                        continue
                    view = self.region.at(offset, code)
                    try:
                        yield i, view
                    finally:
                        view.release()
            finally:
                for _, offset, _ in batch:
                    reads.give(offset)
            todo = rest

    def check_integrity(self) -> None:
        self.region.check_integrity()

    def close(self) -> None:
        """Unregister the region, then free it (no put or read may be in flight)."""
        if self.region.closed:
            return
        self.client.unregister(self.region.address)
        self.region.close()


def store_io(client: StoreClient, zero_copy: bool, write_bytes: int, read_bytes: int) -> StoreIO:
    """The ``StoreIO`` of a URL's ``zerocopy`` (module docstring)."""
    if zero_copy:
        return StagedIO(client, write_bytes, read_bytes)
    return CopyingIO(client)
