"""Why a request of the chat workload missed what it missed (reported by ``chat_loss.py``).

``Evictions`` hooks the block pool's ``on_take`` (called with the blocks the
pool is about to reuse) and remembers, per cached key ``(group, hash)``, when
it was evicted and how the free set ranked it then: its value class and its
age in pool turnovers (the cost-aware free set's clock over its span; None
under ``lru``), and whether the reuse horizon had dropped its bonus.

``Attribution`` is called at each admission with the request's hit, the
tokens full attention alone matched (``branch``) and its ceiling (the
previous turn's prompt): the lost tokens ``ceiling - hit`` split in two,

- *full*: ``ceiling - branch``: full attention's own block at ``branch`` was
  evicted (the first missing one is looked up);
- *other*: ``min(branch, ceiling) - hit``: full attention had more, but a
  block another group needs for a hit at the deepest hit boundary below
  ``min(branch, ceiling)`` was evicted (a chunk's blocks on Llama 4 Scout;
  the first missing one is looked up);

each keyed by the missing block's class and age at its eviction. With two
runs of one workload, ``compare`` shows where one loses to the other,
request by request, by the losing run's key.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Age bins (pool turnovers at eviction).
AGE_BINS = (0.25, 0.5, 1.0, 2.0, 4.0, float("inf"))


def age_bin(age: float | None) -> str:
    if age is None:
        return "age ?"
    lo = 0.0
    for hi in AGE_BINS:
        if age < hi:
            return f"age {lo:g}-{hi:g}" if hi != float("inf") else f"age >={lo:g}"
        lo = hi
    raise AssertionError


@dataclass
class Evictions:
    """Per cached key, its last eviction: (request index, class, age, expired)."""

    pool: Any
    now: list[int]  # [index of the request being served]
    last: dict[tuple[int, bytes], tuple[int, int | None, float | None, bool]] = field(
        default_factory=dict
    )
    by_class: Counter[tuple[int | None, str, bool]] = field(default_factory=Counter)

    def install(self) -> None:
        assert self.pool.on_take is None, "a tier already watches the pool"
        self.pool.on_take = self.on_take

    def on_take(self, blocks: list[Any]) -> None:
        fs = self.pool.policy
        weight = getattr(fs, "weight", None)
        reuse = getattr(fs, "reuse", None)
        horizon = None if reuse is None else reuse.horizon
        for b in blocks:
            if b.block_hash is None:
                continue
            cls = b.free_class
            age = None
            expired = False
            if weight is not None and cls is not None:
                released = b.evict_key - weight * cls / 2
                age = fs.clock / fs.span - released
                expired = horizon is not None and cls > 0 and age > horizon / fs.span
            self.last[b.group_id, b.block_hash] = (self.now[0], cls, age, expired)
            self.by_class[cls, age_bin(age), expired] += 1


@dataclass
class Attribution:
    """Lost tokens per request and per key (module docstring)."""

    lost: list[tuple[str, int]] = field(default_factory=list)  # per request: (key, tokens)
    by_key: Counter[str] = field(default_factory=Counter)
    other_lost: list[int] = field(default_factory=list)
    full_lost: list[int] = field(default_factory=list)

    def admit(
        self,
        hit: int,
        branch: int,
        ceiling: int,
        group_hashes: Sequence[list[bytes]],
        managers: Sequence[Any],
        pool: Any,
        ev: Evictions,
        full_gid: int,
    ) -> None:
        full_part = max(0, ceiling - branch)
        other_part = max(0, min(branch, ceiling) - hit)
        self.full_lost.append(full_part)
        self.other_lost.append(other_part)
        key = "none"
        if full_part:
            bs = managers[full_gid].block_size
            h = group_hashes[full_gid][branch // bs]
            key = "full " + _describe(ev.last.get((full_gid, h)), ev.now[0])
        elif other_part:
            key = "other " + self._other(
                min(branch, ceiling), group_hashes, managers, pool, ev, full_gid
            )
        self.lost.append((key, full_part + other_part))
        self.by_key[key] += full_part + other_part

    @staticmethod
    def _other(
        top: int,
        group_hashes: Sequence[list[bytes]],
        managers: Sequence[Any],
        pool: Any,
        ev: Evictions,
        full_gid: int,
    ) -> str:
        """The first block missing for a hit at the deepest common boundary below ``top``."""
        step = 1
        for m in managers:
            step = step * m.block_size // _gcd(step, m.block_size)
        p = top - top % step
        for gid, m in enumerate(managers):
            if gid == full_gid or not m.has_skips or p == 0:
                continue
            bs = m.block_size
            for j in range(m.first_needed_block(p), p // bs):
                h = group_hashes[gid][j]
                if h not in pool.cached[gid]:
                    return _describe(ev.last.get((gid, h)), ev.now[0])
        return "(no block missing at the boundary)"


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _describe(rec: tuple[int, int | None, float | None, bool] | None, now: int) -> str:
    if rec is None:
        return "never cached"
    _, cls, age, expired = rec
    return f"class {cls}, {age_bin(age)}{', expired' if expired else ''}"


def report_why(att: Attribution, ev: Evictions) -> None:
    print("lost tokens by the first missing block (kind, class and age at its eviction):")
    total = sum(att.by_key.values()) or 1
    for key, v in att.by_key.most_common(14):
        print(f"  {key}: {v / 1e6:.3f} Mtok ({v / total:.2f})")
    print(
        f"  full part {sum(att.full_lost) / 1e6:.3f} Mtok, "
        f"other part {sum(att.other_lost) / 1e6:.3f} Mtok"
    )
    print("evicted blocks (class, age at eviction, expired): share")
    n = sum(ev.by_class.values()) or 1
    for (cls, age, expired), v in sorted(ev.by_class.items(), key=lambda x: -x[1])[:12]:
        print(f"  class {cls}, {age}{', expired' if expired else ''}: {v / n:.3f}")


def compare(name: str, att: Attribution, hits: list[int], ref_name: str, ref: list[int]) -> None:
    """Where run ``name`` loses to ``ref_name``, request by request, by ``name``'s key."""
    lost: Counter[str] = Counter()
    won: Counter[str] = Counter()
    count: defaultdict[str, int] = defaultdict(int)
    for (key, _), h, r in zip(att.lost, hits, ref, strict=True):
        if r > h:
            lost[key] += r - h
            count[key] += 1
        elif h > r:
            won[key] += h - r
    print(
        f"\n## {name} against {ref_name}: loses {sum(lost.values()) / 1e6:.3f} Mtok, "
        f"wins {sum(won.values()) / 1e6:.3f} Mtok"
    )
    for key, v in lost.most_common(10):
        print(f"  loses {v / 1e6:.3f} Mtok in {count[key]} requests: {key}")
