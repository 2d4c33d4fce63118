"""``SimOptions``: the settings of one replay (one layout, budget and policy).

Defaults follow the engine's scheduler limits of vLLM's own defaults
(64 sequences, 8192 batched tokens, 16-token blocks). ``arrivals="trace"``
releases each request at its trace timestamp; ``"closed"`` releases every
request at time 0, so only the scheduler's own limits (``max_num_seqs``,
the token budget, the KV memory) pace the replay. ``hash_algo`` defaults to
``sha256``: both give the same hits, and although xxhash hashes a prompt about
2x faster, it must compare the stored token ids of every block a lookup visits,
which costs more; measured on 800 conversation-trace requests with
gemma-3-27b at 80 GB, sha256 replays in 19.3 s of CPU, xxhash in 20.5 s.
``return_bonus``, ``return_grade``, ``value_weight`` and ``floor_tokens`` tune
the ``hybrid`` policy (``HybridOptions``' fields of those names; None: the
defaults), and ``tuning`` overrides its fitted numbers (``key=value`` texts of
``HybridTuning``'s fields); they are an error
under ``lru``, where they
would change nothing. Invalid values raise a one-line ``ValueError`` naming
the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridkv.core.hashing import HASH_ALGOS
from hybridkv.offload.swap_decision import PREEMPTION_MODES
from hybridkv.policy import CACHE_POLICIES, HybridOptions
from hybridkv.policy.options import check_floor_knob, check_hybrid_knob, check_return_grade
from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning, parse_tuning

ARRIVALS = ("trace", "closed")


def _positive(value: object, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be an integer >= 1, got {value!r}")


def policy_label(
    policy: str,
    return_bonus: float | None,
    value_weight: float | None,
    floor_tokens: int | None = None,
    return_grade: str | None = None,
    tuning: str | None = None,
) -> str:
    """The policy, with the ``hybrid`` knobs set away from their defaults:
    ``hybrid (bonus 8, grade turn, weight 1, floor 8960, tuning floor_ratio=16)``."""
    knobs = [
        f"{name} {value:g}" if name != "grade" else f"grade {value}"
        for name, value in (
            ("bonus", return_bonus),
            ("grade", return_grade),
            ("weight", value_weight),
            ("floor", floor_tokens),
        )
        if value is not None
    ]
    if tuning:
        knobs.append(f"tuning {tuning}")
    return f"{policy} ({', '.join(knobs)})" if knobs else policy


def label_of(run: Any) -> str:
    """``policy_label`` of anything with the fields of a run (``SimOptions``,
    ``SimResult``): its policy and ``hybrid`` knobs."""
    return policy_label(
        run.policy,
        run.return_bonus,
        run.value_weight,
        run.floor_tokens,
        run.return_grade,
        run.tuning,
    )


@dataclass(frozen=True)
class SimOptions:
    """One replay's settings (see the module docstring)."""

    memory_bytes: int
    policy: str = "lru"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    arrivals: str = "trace"
    max_model_len: int | None = None
    hash_algo: str = "sha256"
    return_bonus: float | None = None
    value_weight: float | None = None
    floor_tokens: int | None = None
    return_grade: str | None = None
    #: ``HybridTuning`` overrides as ``key=value`` texts, comma-separated (None: none).
    tuning: str | None = None
    #: The modeled host tier's bytes (None: no tiers; ``sim/tier_model.py``).
    host_memory_bytes: int | None = None
    #: The modeled disk tier's bytes, below the host (None: none).
    disk_bytes: int | None = None
    #: ``swap`` | ``recompute`` | None: the engine's ``preemption_mode``
    #: (None: its cost model decides; ``sim/tier_swap.py``). No host tier: recompute.
    preemption_mode: str | None = None

    def __post_init__(self) -> None:
        _positive(self.memory_bytes, "memory")
        _positive(self.max_num_seqs, "max_num_seqs")
        _positive(self.max_num_batched_tokens, "max_num_batched_tokens")
        _positive(self.block_size, "block_size")
        if self.max_model_len is not None:
            _positive(self.max_model_len, "max_model_len")
        if self.host_memory_bytes is not None:
            _positive(self.host_memory_bytes, "host_memory")
        if self.disk_bytes is not None:
            _positive(self.disk_bytes, "disk")
            if self.host_memory_bytes is None:
                raise ValueError("disk is the tier below the host: set host_memory too")
        if self.preemption_mode not in (None, *PREEMPTION_MODES):
            raise ValueError(
                f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, "
                f"got {self.preemption_mode!r}"
            )
        if self.preemption_mode == "swap" and self.host_memory_bytes is None:
            raise ValueError("preemption_mode swap needs a host tier to swap to: set host_memory")
        if self.policy not in CACHE_POLICIES:
            raise ValueError(
                f"policy must be one of {', '.join(CACHE_POLICIES)}, got {self.policy!r}"
            )
        if self.arrivals not in ARRIVALS:
            raise ValueError(
                f"arrivals must be one of {', '.join(ARRIVALS)}, got {self.arrivals!r}"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"hash_algo must be one of {', '.join(HASH_ALGOS)}, got {self.hash_algo!r}"
            )
        for field, check in (
            ("return_bonus", check_hybrid_knob),
            ("return_grade", check_return_grade),
            ("value_weight", check_hybrid_knob),
            ("floor_tokens", check_floor_knob),
            ("tuning", _check_tuning),
        ):
            value = getattr(self, field)
            if value is None:
                continue
            check(value, field)
            if self.policy != "hybrid":
                raise ValueError(
                    f"{field} tunes the hybrid policy; it changes nothing under {self.policy!r}"
                )

    @property
    def policy_label(self) -> str:
        """``policy_label`` of these options."""
        return label_of(self)

    @property
    def hybrid(self) -> HybridOptions:
        """The ``HybridOptions`` these options set (the defaults where None)."""
        knobs: dict[str, Any] = {
            "hybrid_return_bonus": None if self.return_bonus is None else float(self.return_bonus),
            "hybrid_value_weight": None if self.value_weight is None else float(self.value_weight),
            "hybrid_floor_tokens": self.floor_tokens,
            "hybrid_return_grade": self.return_grade,
            "hybrid_tuning": None if self.tuning is None else _tuning(self.tuning),
        }
        return HybridOptions.from_knobs(**{k: v for k, v in knobs.items() if v is not None})


def _tuning(text: str) -> HybridTuning:
    """``key=value`` texts -> the tuning they set over the defaults."""
    return DEFAULT_TUNING.with_text(parse_tuning([text]))


def _check_tuning(value: object, field: str) -> None:
    """``key=value`` overrides of ``HybridTuning`` (``ValueError`` naming the field)."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be key=value texts, got {value!r}")
    _tuning(value)
