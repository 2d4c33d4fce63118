"""``CachePolicy``: every cache-policy decision, behind a few hooks of plain data.

The coordinator owns the block tables and the pool; a policy owns what to
keep and in which order to let it go. The coordinator calls:

- ``hold(group_id)`` once, when it builds a group's manager: what a running
  request holds beyond what its next query reads (``managers.points.Hold``;
  None: nothing, every computed block is cached);
- ``grid`` per allocation: the branch grid in force (0: none), for the
  Mamba snapshots a new table's entries get (``hybridkv.managers.snapshots``);
- ``kept_points(admission)`` before a request's first allocation with a
  prefix lookup, and ``admit(admission)`` once it succeeded: the policy learns
  from it and answers its kept points and its returning turn;
- ``release(request_id, tables, block_hashes, num_tokens)`` when a request is
  freed: the order and the value with which its blocks return to the free
  set, as ``ReleaseRun``s;
- ``make_room(managers, short, request_id)`` when the running request
  ``request_id``'s step does not fit: which request gives up which kept points
  (``Shed``), or None;
- ``check_integrity(live)``.

A policy never calls back into the coordinator and never changes a manager:
the coordinator applies what it returns. The free set's ranking (which free
block is reused first) is the policy's too: ``eviction_factory`` builds it
for the block pool.

**Tiers.** A later tier (host RAM, disk, a remote store) asks the same
object: ``writes_through`` says whether a block is stored as it is computed
(``lru``) or demoted when the pool reuses it (``hybrid``); ``store_value(block)``
says which freed blocks a store shared by replicas gets, and
``store_on_compute`` which blocks it gets as soon as a step computes them;
``demotion_order(pool)`` ranks the free blocks, and the ``value`` of
a ``ReleaseRun`` is what a hit on its blocks saves per page, so a tier
demotes the lowest-ranked first; ``demotion_value`` says what a lower tier's
copy of a block the pool reuses is worth: a run released ``evict_first`` (no
kept point needs it) is offered with the value ``SPARE``, which a tier takes
only into spare room (``hybridkv/tiers/spare.py``); ``kept_points``
say which states a request will resume from, hence what to load
(``docs/architecture.md``, "The cache policy, and a later tier").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
from hybridkv.managers.points import Hold
from hybridkv.tiers.spare import is_spare


class ReleaseRun(NamedTuple):
    """Blocks to release, in order: ``evict_first`` (no kept point needs
    them) or with the ``value`` of their hit unit (None: the free set's
    default rank). ``held``: every block has ref count 1 (only the freed
    request holds it), so each becomes free (``BlockPool.free_held_blocks``)."""

    blocks: Sequence[KVCacheBlock]
    evict_first: bool = False
    value: float | None = None
    held: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    """A request admitted with a prefix lookup (plain data for ``CachePolicy.admit``).

    ``hit``: tokens of the hit it takes; ``branch``: tokens full attention
    alone matched (whole blocks, ``KVCacheBlocks.full_hit_tokens``);
    ``num_tokens`` / ``num_prompt_tokens``: its tokens and its prompt's;
    ``block_hashes``: its hash-block-size block hashes; ``packed_prompt``: its
    prompt as uint32; ``resumed``: it resumes after a preemption;
    ``returning``: its returning turn from a first admission (None: not known yet).
    """

    request_id: str
    hit: int
    branch: int
    num_tokens: int
    num_prompt_tokens: int
    block_hashes: list[bytes]
    packed_prompt: bytes
    resumed: bool
    returning: int | None


class ComputeStores(NamedTuple):
    """``store_on_compute``'s answer: as a step computes a running request's blocks,
    the store shared by replicas gets those that a hit at one of ``points`` needs
    (None: every full block computed), each unit worth ``value``."""

    points: tuple[int, ...] | None
    value: float


class Shed(NamedTuple):
    """``make_room``'s answer: ``request_id`` keeps only ``kept`` and releases
    every block it retains. ``holds_tail`` False (only for the request whose
    step did not fit): it gives its tail up too, for good (``Hold.tail``), and
    holds only what its query reads, as under ``lru``; the coordinator applies
    that only if the step then fits (it counts that itself, first)."""

    request_id: str
    kept: tuple[int, ...]
    holds_tail: bool = True


#: A freed request's tables: each group's manager and the request's state there.
Tables = Sequence[tuple[SingleTypeKVCacheManager, RequestBlockState]]


class CachePolicy(ABC):
    """What to keep and what to let go first (module docstring)."""

    #: ``"lru"`` or ``"hybrid"``.
    name: str = ""
    #: True when requests keep points and hold blocks for them (``hybrid``).
    keeps_points: bool = False

    def hold(self, group_id: int) -> Hold | None:
        """What group ``group_id``'s running requests hold (None: nothing extra)."""
        return None

    @property
    def grid(self) -> int:
        """The branch grid in force for new Mamba snapshots (0: none)."""
        return 0

    def kept_points(self, admission: Admission) -> tuple[int, ...]:
        """A request about to be admitted: its kept points (ascending). Asked
        before the allocation, which may still fail (then asked again)."""
        return ()

    def admit(self, admission: Admission) -> int | None:
        """The request was admitted: learn from it; its returning turn (None:
        the policy keeps no such thing)."""
        return None

    @abstractmethod
    def release(
        self,
        request_id: str,
        tables: Tables,
        block_hashes: list[bytes] | None,
        num_tokens: int | None,
    ) -> list[ReleaseRun]:
        """A freed request's blocks (``tables``, already out of the managers),
        as runs to release in order. ``block_hashes``: its hash-block-size
        hashes (None: unknown); ``num_tokens``: its computed tokens."""

    def make_room(
        self, managers: Sequence[SingleTypeKVCacheManager], short: int, request_id: str
    ) -> Shed | None:
        """Who gives up kept points so that ``short`` more blocks are free for
        the step of the live request ``request_id`` (None: nobody; the step
        fails). Read-only."""
        return None

    #: Lower tiers rank this policy's units by value per byte (else plain LRU).
    ranks_tiers: bool = False
    #: Each block goes to the host tier as soon as it is computed (vLLM's
    #: ``OffloadingConnector``: write-through), not when the pool reuses it;
    #: then ``demotion_value`` is None for every block (nothing is demoted).
    writes_through: bool = False

    def demotion_value(self, block: KVCacheBlock) -> float | None:
        """The free, cached ``block`` is about to be reused: what a lower tier's
        copy of its unit is worth (its ``ReleaseRun`` value); ``SPARE`` (0.0):
        only into a tier's spare room, never in place of a valued unit, and the
        tier's first victim (``hybridkv/tiers/spare.py``); None: not demoted.
        Read-only."""
        return 1.0

    def store_value(self, block: KVCacheBlock) -> float | None:
        """The cached ``block`` was just freed (its request let go of it): what a
        copy of its unit in a store shared by replicas is worth (None: not
        written). Every freed block's run was computed, so this is when a prompt
        prefix, a document or a conversation turn becomes shareable. By default
        the demotion rule: under ``hybrid`` the run's release value (a run
        released ``evict_first``, which no kept point needs, is never written),
        under ``lru`` every block (``LruPolicy``). A unit worth only spare room
        (``SPARE``) is not written. Read-only."""
        value = self.demotion_value(block)
        return None if is_spare(value) else value

    def store_on_compute(
        self, request_id: str, kept: tuple[int, ...], num_prompt_tokens: int
    ) -> ComputeStores | None:
        """A step of the running request ``request_id`` (its ``kept`` points, a
        prompt of ``num_prompt_tokens``) computed blocks: which of them a store
        shared by replicas gets now, before the request frees them
        (``store_value`` then decides the rest), so that another replica's
        request on the same prefix hits while this one still runs. None (the
        default): nothing before the free. Read-only."""
        return None

    def demotion_order(self, pool: BlockPool) -> Iterator[KVCacheBlock]:
        """The pool's free blocks, the first to be reused (or demoted to a
        lower tier) first: the ranking this policy's ``eviction_factory`` gave
        the pool. Read-only."""
        return iter(pool.policy)

    @abstractmethod
    def check_integrity(self, live: set[str]) -> None:
        """Assert the policy's invariants; ``live``: the live request ids."""
