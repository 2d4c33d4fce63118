"""``HybridOptions``: the ``hybrid`` cache policy's settings, as one frozen value.

One object travels from ``LLM`` / ``hybridkv simulate`` / ``hybridkv serve``
through ``KVCacheManager`` to the policy, instead of a list of ``hybrid_*``
arguments at every layer. The same names stay accepted as keyword arguments
and CLI flags (``KVCacheManager(hybrid_value_weight=2)`` is
``KVCacheManager(hybrid=HybridOptions(value_weight=2))``).

- ``tail_tokens``: tokens before a request's end whose block boundaries stay
  hit points (None: ``tuning.tail_tokens``);
- ``value_weight``: pool turnovers one doubling of a unit's value is worth (0:
  recency only; None: by the layout's costliest kind, ``HybridTuning.value_weight``);
- ``tail_align``: the tail's alignment (None: learned from where requests
  branch; 0: every boundary; ``A``: multiples of ``A`` only);
- ``return_bonus``: pool turnovers a returning request's units are kept longer
  (0: off; None: ``tuning.return_bonus``);
- ``return_grade``: how that bonus grows with a returning request's turn
  (``"flat"``, ``"turn"``, ``"log-turn"``);
- ``floor_tokens``: tokens between two snapshot floor points, fixed (None: by
  cost and kind; 0: no floor);
- ``tuning``: the fitted numbers (``HybridTuning``);
- ``tier_cover``: (device + host tier bytes) / device bytes (1: the device
  alone; set by ``for_host_tier``, not a user knob): with a return bonus's reach
  in tokens (``tuning.return_bonus_tokens``) the host tier caps a returning
  unit's stay at that reach (``policy.returning.host_return_share``).

Invalid values raise a ``ValueError`` that names the ``hybrid_*`` keyword.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning

#: ``return_grade`` names (``hybridkv.policy.returning.grade``).
RETURN_GRADE_NAMES = ("flat", "turn", "log-turn")
#: The default grade.
RETURN_GRADE = "flat"
#: The ``hybrid_*`` keywords and the ``HybridOptions`` field each sets.
KNOBS = {
    "hybrid_tail_tokens": "tail_tokens",
    "hybrid_value_weight": "value_weight",
    "hybrid_tail_align": "tail_align",
    "hybrid_return_bonus": "return_bonus",
    "hybrid_return_grade": "return_grade",
    "hybrid_floor_tokens": "floor_tokens",
    "hybrid_tuning": "tuning",
}


def check_hybrid_knob(value: object, field: str) -> None:
    """A finite number ``>= 0`` (not a bool); ``ValueError`` naming ``field`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")


def check_floor_knob(value: object, field: str, expected: str = "an int >= 0") -> None:
    """An int ``>= 0`` (not a bool): a token count such as ``hybrid_floor_tokens``;
    ``ValueError`` naming ``field`` and what is ``expected`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be {expected}, got {value!r}")


def check_return_grade(value: object, field: str) -> None:
    """One of ``RETURN_GRADE_NAMES``; ``ValueError`` naming ``field`` otherwise."""
    if not isinstance(value, str) or value not in RETURN_GRADE_NAMES:
        raise ValueError(f"{field} must be one of {', '.join(RETURN_GRADE_NAMES)}, got {value!r}")


def as_tuning(value: object, field: str = "hybrid_tuning") -> HybridTuning:
    """A ``HybridTuning``, or a mapping of overrides of the defaults."""
    if isinstance(value, HybridTuning):
        return value
    if isinstance(value, dict):
        return DEFAULT_TUNING.replace(**value)
    raise ValueError(f"{field} must be a HybridTuning or a dict of its fields, got {value!r}")


@dataclass(frozen=True, slots=True)
class HybridOptions:
    """The ``hybrid`` policy's settings (module docstring)."""

    tail_tokens: int | None = None
    value_weight: float | None = None
    tail_align: int | None = None
    return_bonus: float | None = None
    return_grade: str = RETURN_GRADE
    floor_tokens: int | None = None
    tuning: HybridTuning = field(default=DEFAULT_TUNING)
    tier_cover: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.tier_cover, int | float) and 1 <= self.tier_cover < math.inf):
            raise ValueError(f"tier_cover must be a finite number >= 1, got {self.tier_cover!r}")
        if self.tail_tokens is not None:
            check_floor_knob(self.tail_tokens, "hybrid_tail_tokens")
        if self.tail_align is not None:
            check_floor_knob(self.tail_align, "hybrid_tail_align", "None (learn) or an int >= 0")
        if self.return_bonus is not None:
            check_hybrid_knob(self.return_bonus, "hybrid_return_bonus")
        check_return_grade(self.return_grade, "hybrid_return_grade")
        if self.floor_tokens is not None:
            check_floor_knob(
                self.floor_tokens, "hybrid_floor_tokens", "None (by cost) or an int >= 0"
            )
        if self.value_weight is not None:
            check_hybrid_knob(self.value_weight, "hybrid_value_weight")
        if not isinstance(self.tuning, HybridTuning):
            object.__setattr__(self, "tuning", as_tuning(self.tuning))

    @classmethod
    def from_knobs(cls, base: HybridOptions | None = None, **knobs: Any) -> HybridOptions:
        """``base`` (default: the defaults) with the ``hybrid_*`` keywords in
        ``knobs`` set. A knob whose default is None (``value_weight``,
        ``tail_align``, ``floor_tokens``, ``tuning``) given as None keeps
        ``base``'s value; for the others None is an error."""
        unknown = sorted(set(knobs) - set(KNOBS))
        if unknown:
            raise ValueError(
                f"unknown hybrid option {', '.join(unknown)}; known: {', '.join(KNOBS)}"
            )
        base = base if base is not None else cls()
        if not isinstance(base, HybridOptions):
            raise ValueError(f"hybrid must be a HybridOptions, got {base!r}")
        for k in ("hybrid_tail_tokens", "hybrid_return_bonus", "hybrid_return_grade"):
            if k in knobs and knobs[k] is None:  # no None default: an error, not "unchanged"
                {
                    "hybrid_tail_tokens": check_floor_knob,
                    "hybrid_return_bonus": check_hybrid_knob,
                    "hybrid_return_grade": check_return_grade,
                }[k](None, k)
        changes = {KNOBS[k]: v for k, v in knobs.items() if v is not None}
        if "tuning" in changes:
            changes["tuning"] = as_tuning(changes["tuning"])
        if not changes:
            return base
        values: dict[str, Any] = {f: getattr(base, f) for f in KNOBS.values()}
        values["tier_cover"] = base.tier_cover  # not a knob: kept
        values.update(changes)
        return cls(**values)

    @property
    def tail(self) -> int:
        """The tail's tokens in force (``tail_tokens``, else the tuning's)."""
        return self.tuning.tail_tokens if self.tail_tokens is None else self.tail_tokens

    @property
    def bonus(self) -> float:
        """The return bonus in force (``return_bonus``, else the tuning's)."""
        return self.tuning.return_bonus if self.return_bonus is None else float(self.return_bonus)


def for_host_tier(
    options: HybridOptions | None, device_bytes: int, host_bytes: int
) -> HybridOptions:
    """``options`` for a device pool of ``device_bytes`` with a host tier of
    ``host_bytes`` under it: the memory of seen prompts (``SeenPrefixes``,
    ``seen_per_block`` per pool block) grows by ``(device + host) / device``, so
    that it covers what device and host hold together and a prompt demoted to the
    host is still known as returning when it comes back. (Sized for the device
    alone it held gemma-3-27b's tier at 82 % of the same bytes on the device at 8x,
    4,000 Mooncake requests; ``benchmarks/results/tiers-sim.md``. A disk tier is
    not counted: untested, and often 10-100x the device.) ``tier_cover`` becomes
    ``(device + host) / device``: with ``tuning.return_bonus_tokens`` the host's
    ranking gets its own return bonus (``host_return_share``)."""
    options = options if options is not None else HybridOptions()
    if host_bytes <= 0:
        return options
    tuning = options.tuning
    seen = -(-tuning.seen_per_block * (device_bytes + host_bytes) // device_bytes)
    return replace(
        options,
        tuning=tuning.replace(seen_per_block=seen),
        tier_cover=(device_bytes + host_bytes) / device_bytes,
    )
