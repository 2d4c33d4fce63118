"""Step time of a scheduled batch: a roofline over FLOPs and HBM bytes.

A step computes, for each scheduled request, the tokens ``[start, end)``
(a prefill chunk, or one decode token). On a ``DeviceProfile``::

    time  = max(flops / device.flops, bytes / device.bandwidth) + overhead
    flops = 2 * active_params * new_tokens                 (the weights' GEMMs)
          + sum over attention layers: 4 * width * attended pairs
          + sum over Mamba layers: 6 * state elements * new_tokens
    bytes = 2 * active_params                              (bf16 weights, once a step)
          + sum over attention layers: token bytes * tokens read
          + sum over Mamba layers: state bytes             (one state per request)

Attended pairs: the token at position ``p`` attends to ``p + 1`` keys under
full attention, ``min(p + 1, W)`` with a sliding window ``W``, and
``p mod C + 1`` with attention chunks of ``C``; summed over ``[start, end)``
in closed form. 4 FLOPs per (query, key) pair and hidden unit: one
multiply-add for ``q . k`` and one for ``p . v``.

Tokens read per request and layer: full attention reads the whole context
(``end``), a sliding window the ``W - 1`` tokens before the chunk plus the
chunk, chunked attention from the start of the current chunk to ``end``.

Approximations, on purpose:

- ``width = num_kv_heads * head_size``: the layouts hold KV heads only, not
  query heads, so grouped-query models' attention FLOPs are undercounted by
  their query/KV head ratio (the weights' term, usually larger, is exact);
- the weights are read once a step at their active size; a mixture-of-experts
  batch touches more experts than one token does;
- the Mamba scan costs 6 FLOPs per state element and token (decay multiply,
  input add, output dot product); its projections are in ``active_params``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hybridkv.sim.devices import DeviceProfile
from hybridkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from hybridkv.specs.base import prod

if TYPE_CHECKING:
    from hybridkv.layouts import ModelLayout

WEIGHT_BYTES_PER_PARAM = 2  # bf16 weights
ATTENTION_FLOPS_PER_PAIR_UNIT = 4
MAMBA_FLOPS_PER_STATE_ELEMENT = 6

KIND_FULL, KIND_SLIDING, KIND_CHUNKED = "full", "sliding_window", "chunked_local"


def attended_pairs(kind: str, span: int, start: int, end: int) -> int:
    """Sum over positions ``p`` in ``[start, end)`` of the keys ``p`` attends to.

    ``span`` is the window ``W`` (sliding) or chunk ``C`` (chunked); ignored
    for full attention.
    """
    return _pairs_before(kind, span, end) - _pairs_before(kind, span, start)


def _pairs_before(kind: str, span: int, n: int) -> int:
    """Attended pairs of positions ``0 .. n-1``."""
    if kind == KIND_FULL or n <= span:
        return n * (n + 1) // 2
    if kind == KIND_SLIDING:
        return span * (span + 1) // 2 + (n - span) * span
    q, r = divmod(n, span)
    return q * (span * (span + 1) // 2) + r * (r + 1) // 2


def tokens_read(kind: str, span: int, start: int, end: int) -> int:
    """Tokens of K/V one layer reads to compute ``[start, end)``."""
    if kind == KIND_FULL:
        return end
    if kind == KIND_SLIDING:
        return min(end, span - 1 + end - start)
    return end - (start // span) * span


@dataclass(frozen=True, slots=True)
class AttentionLayers:
    """``count`` attention layers of one kind and shape.

    ``span``: the window (sliding) or chunk size (chunked), 0 for full.
    ``width``: ``num_kv_heads * head_size``. ``token_bytes``: K and V of one token.
    """

    kind: str
    span: int
    count: int
    width: int
    token_bytes: int


@dataclass(frozen=True, slots=True)
class MambaLayers:
    """``count`` Mamba layers with states of ``state_elements`` / ``state_bytes``."""

    count: int
    state_elements: int
    state_bytes: int


@dataclass(frozen=True, slots=True)
class StepCost:
    """FLOPs, HBM bytes and modeled seconds of one step."""

    flops: float
    bytes: float
    seconds: float


def _attention_layers(spec: AttentionSpec) -> AttentionLayers:
    width = spec.num_kv_heads * spec.head_size
    token_bytes = 2 * width * spec.dtype_bytes
    if isinstance(spec, SlidingWindowSpec):
        return AttentionLayers(KIND_SLIDING, spec.sliding_window, 1, width, token_bytes)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return AttentionLayers(KIND_CHUNKED, spec.attention_chunk_size, 1, width, token_bytes)
    assert isinstance(spec, FullAttentionSpec), spec
    return AttentionLayers(KIND_FULL, 0, 1, width, token_bytes)


@dataclass(frozen=True)
class CostModel:
    """The roofline step-time model of one model on one device (module docstring)."""

    device: DeviceProfile
    active_params: float
    attention: tuple[AttentionLayers, ...]
    mamba: tuple[MambaLayers, ...]
    # Derived in __post_init__ for the hot loop: per (kind, span), the summed
    # FLOPs-per-pair and bytes-per-token coefficients; per-token FLOPs; state bytes.
    _terms: tuple[tuple[str, int, float, float], ...] = field(init=False, repr=False)
    _flops_per_token: float = field(init=False, repr=False)
    _state_bytes: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.active_params > 0:
            raise ValueError(f"active_params must be > 0, got {self.active_params!r}")
        terms: dict[tuple[str, int], list[float]] = {}
        for a in self.attention:
            t = terms.setdefault((a.kind, a.span), [0.0, 0.0])
            t[0] += ATTENTION_FLOPS_PER_PAIR_UNIT * a.width * a.count
            t[1] += a.token_bytes * a.count
        object.__setattr__(self, "_terms", tuple((k, s, f, b) for (k, s), (f, b) in terms.items()))
        per_token = 2 * self.active_params + sum(
            MAMBA_FLOPS_PER_STATE_ELEMENT * m.state_elements * m.count for m in self.mamba
        )
        object.__setattr__(self, "_flops_per_token", per_token)
        object.__setattr__(self, "_state_bytes", sum(m.state_bytes * m.count for m in self.mamba))

    @classmethod
    def from_layout(
        cls, layout: ModelLayout, device: DeviceProfile, active_params: float
    ) -> CostModel:
        """The model of ``layout``'s layers (raw specs, before page unification)."""
        attention: dict[AttentionLayers, int] = {}
        mamba: dict[MambaLayers, int] = {}
        for spec in layout.kv_cache_specs(16).values():
            if isinstance(spec, MambaSpec):
                elements = sum(prod(s) for s in spec.shapes)
                m = MambaLayers(1, elements, spec.state_size_bytes)
                mamba[m] = mamba.get(m, 0) + 1
            else:
                assert isinstance(spec, AttentionSpec), spec
                a = _attention_layers(spec)
                attention[a] = attention.get(a, 0) + 1
        return cls(
            device,
            active_params,
            tuple(
                AttentionLayers(a.kind, a.span, n, a.width, a.token_bytes)
                for a, n in attention.items()
            ),
            tuple(MambaLayers(n, m.state_elements, m.state_bytes) for m, n in mamba.items()),
        )

    def step(self, chunks: Sequence[tuple[int, int]]) -> StepCost:
        """The cost of computing ``[start, end)`` for each ``(start, end)`` in ``chunks``."""
        if not chunks:
            return StepCost(0.0, 0.0, 0.0)
        # Decodes (one token at position end - 1) attend to as many keys as they
        # read, in a form cheap enough for the hot loop; prefills use the sums.
        decode_ends = [e for s, e in chunks if e - s == 1]
        prefills = (
            [(s, e) for s, e in chunks if e - s != 1] if len(decode_ends) < len(chunks) else []
        )
        flops = 0.0
        read = 0.0
        for kind, span, f_coef, b_coef in self._terms:
            if kind == KIND_FULL:
                decoded = sum(decode_ends)
            elif kind == KIND_SLIDING:
                decoded = sum(e if e < span else span for e in decode_ends)
            else:
                decoded = sum((e - 1) % span + 1 for e in decode_ends)
            pairs = tokens = decoded
            for start, end in prefills:
                pairs += attended_pairs(kind, span, start, end)
                tokens += tokens_read(kind, span, start, end)
            flops += f_coef * pairs
            read += b_coef * tokens
        new_tokens = len(decode_ends) + sum(e - s for s, e in prefills)
        flops += self._flops_per_token * new_tokens
        read += WEIGHT_BYTES_PER_PARAM * self.active_params
        read += self._state_bytes * len(chunks)
        dev = self.device
        seconds = max(flops / dev.flops, read / dev.bandwidth) + dev.step_overhead_s
        return StepCost(flops, read, seconds)
