"""``HybridTuning``: every fitted number of the ``hybrid`` policy, as one frozen value.

The rules that use these numbers are stated where they run (the learners'
docstrings); how each number was measured is in ``docs/hybrid-caching.md``.
One line per value says where it comes from ("cache.md": ``benchmarks/results/
cache.md``; the measurements are gathered in ``docs/hybrid-caching.md``, "Where
each tuned number came from"). Override any of them for an
experiment (``hybridkv simulate --tuning floor_ratio=16``,
``LLM(hybrid_tuning={...})``, ``HybridTuning().replace(...)``); the
defaults are what every figure in ``benchmarks/results/cache.md`` used.

The ``learn_*`` switches turn one learner off at a time (ablation): off, a
learner keeps its neutral answer (no grid, no returning prompts). The
snapshot floor's spacing is not learned: ``floor_ratio`` and its caps fix it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class HybridTuning:
    """The ``hybrid`` policy's fitted numbers and learner switches (module docstring)."""

    # -- kept points (retention) --
    #: Tokens before a freed request's end whose hit boundaries stay kept points
    #: (Mooncake shares prefixes in 512-token units; cache.md "the tail").
    tail_tokens: int = 512
    #: Snapshot floor spacing = this x a point's cost in full-attention tokens
    #: (best of 8-64 for Jamba, conversation trace; cache.md "floor").
    floor_ratio: int = 32
    #: Floor spacing cap with Mamba state groups (Jamba's tuned spacing; lifts
    #: Bamba 12.40 -> 14.88 % at 80 GB; cache.md "floor").
    floor_max_state_tokens: int = 17_920
    #: Floor spacing cap with sliding windows only (of 17,920-32,768 the only one
    #: never below the uncapped Gemma rows; cache.md "floor").
    floor_max_window_tokens: int = 24_576
    # -- cost-aware eviction (value weight by the costliest non-full kind) --
    #: Pool turnovers one value doubling is worth with chunked groups (Llama 4
    #: Scout, re-tuned with returning prompts on both traces; cache.md).
    value_weight_chunked: float = 8.0
    #: ... with Mamba groups (Jamba, conversation trace; 3 lost 0.5 points at 40 GB).
    value_weight_mamba: float = 2.0
    #: ... with sliding windows (Gemma 3 27B; 0 lost 0.1 points at 80 GB).
    value_weight_sliding: float = 1.0
    # -- returning prompts --
    #: Pool turnovers a returning request's units are kept longer (whole
    #: conversation trace, Jamba 10.44 -> 15.94 % at 40 GB; cache.md).
    return_bonus: float = 4.0
    #: The return bonus's reach in prompt tokens in a host tier (0: off, the bonus
    #: counts turnovers of whatever pool holds it). The host caps a returning
    #: unit's whole stay, one host turnover plus its bonus, at this reach: its
    #: bonus is ``min(return_bonus, max(0, return_bonus_tokens / host tokens - 1))``
    #: host turnovers; the device keeps ``return_bonus`` (``host_return_share``: a
    #: demoted unit's return factor is rescaled alone). 33M: the smallest reach
    #: that leaves llama-4-scout's 8x host its whole bonus (it loses otherwise),
    #: which meets jamba-v0.1's whole-trace targets (tiers-sim.md, "rule L").
    return_bonus_tokens: int = 33_000_000
    #: Share of a prompt, from its start, seen before for it to be returning
    #: (``research/bench_reuse_predictors.py``, conversation trace).
    returning_share: float = 0.5
    #: Blocks of history remembered per pool block (hit rates flat above it).
    seen_per_block: int = 8
    #: One block hash in this many is remembered (Jamba whole-trace hit rates
    #: unchanged from sampling every block; cache.md).
    sample_blocks: int = 8
    #: Continuation ratio (returning / first) that earns the whole return bonus
    #: (``ContinuationRates``; 1.2-2 gave the same hit rates on the cells tried).
    return_rate_full: float = 1.41
    #: Turns beyond this count as this one (``turn`` / ``log-turn`` grades).
    max_turn: int = 16
    #: Reuse horizon = this x the largest of the last ``reuse_window`` return gaps
    #: (1 lost 0.53 point on mrqa Jamba 4 GB; 2 kept 0.1 of Scout multiturn 64 GB's
    #: gain; policy-ablation.md "reuse horizon").
    reuse_margin: float = 1.25
    #: Return gaps the reuse horizon remembers (256: +1.93 on Scout multiturn 64 GB,
    #: 64: +3.84; 32: +6.48 but -0.40 on mrqa Jamba 8 GB; policy-ablation.md).
    reuse_window: int = 64
    # -- online learners (tail alignment, fine alignment) --
    #: Observations each learner remembers (the most recent).
    learn_window: int = 256
    #: Observations a learner needs before it moves off its neutral answer.
    learn_min_observed: int = 32
    #: Share of observations a branch grid must explain (tail and fine alignment).
    grid_agree: float = 0.9
    #: Largest mean chance that random divergences fit an adopted fine grid
    #: (Bamba's 512 fits every observation at a chance near 0.5; cache.md).
    fine_chance: float = 0.8
    #: The finest fine grid tried, in tokens.
    fine_min_align: int = 4
    #: A recorded block is cut into about this many chunks (fine alignment).
    fine_chunks_per_block: int = 32
    #: Blocks before a prompt's end recorded chunk by chunk (fine alignment).
    fine_max_records: int = 4096
    #: Marked blocks remembered (fine alignment's prompt ends).
    max_marks: int = 16_384
    # -- learner switches (ablation: False turns one learner off) --
    #: Learn the coarse branch grid of the tail (``TailAlignment``).
    learn_tail_alignment: bool = True
    #: Learn a grid no coarser than the full-attention block (``FineAlignment``).
    learn_fine_alignment: bool = True
    #: Value returning prompts' units longer (``SeenPrefixes``).
    learn_returning: bool = True
    #: Scale the return bonus by measured continuation rates (``ContinuationRates``;
    #: off: the flat bonus; multiturn Bamba 8 GB 50.39 -> 58.26 %, policy-ablation.md).
    learn_return_rates: bool = True
    #: Drop the value bonus of free blocks released longer ago than the reuse
    #: horizon (``ReuseHorizon``; multiturn Scout 64 GB, policy-ablation.md).
    learn_reuse_horizon: bool = True
    # -- rules measured and not adopted (on: the rule, for experiments) --
    #: Charge a chunk's blocks that a tail point shares with its main point to
    #: that point's value (``charged_pages``). Off by default: multiturn Scout
    #: 64 GB 72.71 -> 79.23 %, but 32 GB 53.55 -> 51.78 %; policy-ablation.md "tail pages".
    charge_tail_pages: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind = _KINDS[f.name]
            if kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"tuning {f.name} must be true or false, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"tuning {f.name} must be a number, got {value!r}")
            if kind is int and not isinstance(value, int):
                raise ValueError(f"tuning {f.name} must be an int, got {value!r}")
            if not 0 <= value < float("inf"):
                raise ValueError(f"tuning {f.name} must be a finite number >= 0, got {value!r}")
        for name in ("learn_window", "learn_min_observed", "sample_blocks", "reuse_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"tuning {name} must be >= 1, got {getattr(self, name)!r}")
        if not self.reuse_margin >= 1:
            raise ValueError(f"tuning reuse_margin must be >= 1, got {self.reuse_margin!r}")
        if not self.return_rate_full > 1:
            raise ValueError(f"tuning return_rate_full must be > 1, got {self.return_rate_full!r}")
        if not 0 < self.returning_share <= 1:
            raise ValueError(
                f"tuning returning_share must be in (0, 1], got {self.returning_share!r}"
            )

    def replace(self, **changes: object) -> HybridTuning:
        """A copy with ``changes`` (unknown names: ``ValueError`` listing the known ones)."""
        unknown = sorted(set(changes) - set(TUNING_FIELDS))
        if unknown:
            raise ValueError(
                f"unknown tuning {', '.join(unknown)}; known: {', '.join(TUNING_FIELDS)}"
            )
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def with_text(self, items: Mapping[str, str]) -> HybridTuning:
        """A copy with ``key=value`` texts (the CLI's ``--tuning``), each parsed
        as its field's type."""
        changes: dict[str, object] = {}
        for name, text in items.items():
            if name not in TUNING_FIELDS:
                self.replace(**{name: text})  # the unknown-name error
            changes[name] = _parse(name, text)
        return self.replace(**changes)

    def value_weight(self, kinds: set[str]) -> float:
        """The default value weight of a layout whose non-full kinds are
        ``kinds`` (``"chunked"``, ``"mamba"``, ``"sliding"``): by the costliest
        one, chunked, then Mamba, else sliding."""
        if "chunked" in kinds:
            return self.value_weight_chunked
        if "mamba" in kinds:
            return self.value_weight_mamba
        return self.value_weight_sliding


#: The field names, in declaration order.
TUNING_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(HybridTuning))
#: Each field's type (``int``, ``float`` or ``bool``).
_KINDS: dict[str, type] = {
    f.name: {"int": int, "float": float, "bool": bool}[str(f.type)] for f in fields(HybridTuning)
}
#: The defaults.
DEFAULT_TUNING = HybridTuning()


def _parse(name: str, text: str) -> object:
    kind = _KINDS[name]
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "on", "yes"):
            return True
        if low in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"tuning {name} must be true or false, got {text!r}")
    try:
        return int(text.replace("_", "")) if kind is int else float(text)
    except ValueError:
        what = "an int" if kind is int else "a number"
        raise ValueError(f"tuning {name} must be {what}, got {text!r}") from None


def parse_tuning(texts: list[str], flag: str = "--tuning") -> dict[str, str]:
    """``key=value`` items (each may be a comma list of them) -> ``{key: value}``;
    ``ValueError`` naming ``flag`` on a malformed item."""
    out: dict[str, str] = {}
    for text in texts:
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ValueError(f"{flag} takes key=value items, got {item!r}")
            out[key.strip()] = value.strip()
    return out
