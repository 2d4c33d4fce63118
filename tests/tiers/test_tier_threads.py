"""The tiers with their real copy threads: transfers settle on the copy thread while
the caller stores, loads, pins and evicts; the books must balance at every check and
no transfer may hang (a deadlock between a transfer's lock and the tier's fails here)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from tier_factories import fingerprint, key

from hybridkv.tiers import HostTier, TierFullError, Transfer
from hybridkv.tiers.copier import ThreadCopier
from hybridkv.tiers.disk import DiskTier
from hybridkv.tiers.ledger_tier import LedgerTier
from hybridkv.tiers.slab_memory import SlabMemory


def content(i: int) -> bytes:
    return bytes([i % 251]) * (100 + 37 * (i % 7))


def drive(tier: LedgerTier, seed: int, steps: int = 1500) -> None:
    rng = random.Random(seed)
    loads: list[Transfer] = []
    stores: list[Transfer] = []
    pins: list[int] = []
    for _ in range(steps):
        i = rng.randrange(24)
        op = rng.random()
        if op < 0.3:
            stores += tier.store_many([(key(j), [content(j)], None) for j in (i, (i + 1) % 24)])
        elif op < 0.6:
            transfer = tier.load(key(i))
            if transfer is not None:
                loads.append(transfer)
        elif op < 0.7 and tier.contains(key(i)):
            tier.pin(key(i))
            pins.append(i)
        elif op < 0.8 and pins:
            tier.unpin(key(pins.pop(rng.randrange(len(pins)))))
        elif op < 0.9:
            tier.evict(key(i))
        else:
            tier.poll()
            tier.check_integrity()
    for transfer in stores:
        assert transfer.wait(timeout=30) or isinstance(transfer.error, TierFullError)
    for transfer in loads:
        assert transfer.wait(timeout=30), transfer
        i = next(j for j in range(24) if key(j) == transfer.key)
        assert b"".join(bytes(p) for p in transfer.result) == content(i)
    for i in pins:
        assert tier.contains(key(i))
        tier.unpin(key(i))
    tier.check_integrity()
    tier.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_host_tier_with_its_copy_thread(seed: int) -> None:
    drive(HostTier(fingerprint(), 2000), seed)


def test_disk_tier_with_its_io_thread(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    folder = tmp_path if not shm.is_dir() else shm / f"hybridkv-test-{tmp_path.name}"
    try:
        drive(DiskTier(fingerprint(), folder, 3000), 3, steps=600)
    finally:
        if folder != tmp_path:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


def test_a_slab_host_tier_with_its_copy_thread() -> None:
    tier = HostTier(fingerprint(), 3000, SlabMemory((400,), 3000))
    drive(tier, 7)
    tier.close()


def test_the_copy_thread_and_its_waiters_run_jobs_once_each_in_order() -> None:
    """A waiter runs the jobs queued up to its own in its thread (no wake-up of the
    copy thread to wait for), never two at once, always in submission order."""
    for trial in range(30):
        _jobs_in_order(trial)


def _jobs_in_order(trial: int) -> None:
    copier = ThreadCopier("test-copy")
    ran: list[int] = []
    busy = threading.Lock()
    release = threading.Event()

    def job(i: int, gate: threading.Event | None = None) -> int:
        assert busy.acquire(blocking=False), "two jobs at once"
        try:
            if gate is not None:
                assert gate.wait(10)
            ran.append(i)
            return i
        finally:
            busy.release()

    first = copier.submit(job, 0, release)  # holds the thread (or a waiter) a while
    rest = [copier.submit(job, i) for i in range(1, 6)]
    threading.Timer(0.001 * (trial % 4), release.set).start()
    last = rest[trial % 5]
    last.wait(None)
    assert last.outcome() == (1 + trial % 5, None)
    copier.close()  # runs the rest
    assert ran == list(range(6)) and first.done()
    with pytest.raises(RuntimeError, match="closed"):
        copier.submit(job, 9)


def test_a_wait_with_a_timeout_does_not_run_the_job() -> None:
    copier = ThreadCopier("test-copy")
    gate = threading.Event()
    blocker = copier.submit(gate.wait, 10)
    queued = copier.submit(lambda: threading.current_thread().name)
    with pytest.raises(TimeoutError):
        queued.wait(0.05)
    gate.set()
    queued.wait(None)
    assert blocker.outcome() == (True, None)
    copier.close()


def test_a_queued_job_waits_for_its_waiter_or_a_wake() -> None:
    """``queue`` leaves a job to whoever waits for it (run in the waiter's thread,
    the copy thread never woken for it); ``wake`` hands the rest to the thread. A
    job submitted before a queued one is still the thread's."""
    copier = ThreadCopier("test-copy")
    where = threading.current_thread().name
    first = copier.queue(lambda: threading.current_thread().name)
    with pytest.raises(TimeoutError):
        first.wait(0.05)  # (a wait with a timeout does not run it: nobody did)
    first.wait(None)
    assert first.outcome() == (where, None)
    gate = threading.Event()
    woken = copier.submit(gate.wait, 10)  # the thread's, though a queued job follows
    later = copier.queue(lambda: threading.current_thread().name)
    gate.set()
    woken.wait(5)
    with pytest.raises(TimeoutError):
        later.wait(0.05)
    copier.wake()
    later.wait(5)  # with a timeout: the thread ran it
    assert later.outcome() == ("test-copy", None)
    copier.close()


def test_close_runs_the_queued_jobs() -> None:
    copier = ThreadCopier("test-copy")
    ran: list[int] = []
    copier.queue(ran.append, 1)
    copier.queue(ran.append, 2)
    copier.close()
    assert ran == [1, 2]
