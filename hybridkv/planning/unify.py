"""Page-size unification: make every buffer slot the same size.

All layers live in shared buffers cut into ``num_blocks`` equal slots, so the
bytes one block of one *unit* (what a slot holds) occupies must be the same for
every layer kind. Two strategies:

``vllm`` (the baseline, as vLLM does it):
  - attention layers whose page sizes differ by an integer factor get
    proportionally larger block sizes (the smaller page is scaled up);
  - Mamba layers force the attention block size up, to a multiple of
    ``max(alignment, block_size)`` tokens (kernel alignment), until one
    attention page holds a Mamba state; the Mamba page is padded to it.
    For Jamba-like models this gives attention blocks of 80-528 tokens.
  - every slot holds one layer (``pack == 1``).

``packed`` (hybridkv's alternative, keeps attention blocks small):
  - several attention layers of one group share a slot (``pack`` layers back
    to back), so a slot is ``pack * block_size * bytes_per_token``;
  - with Mamba, the block size only grows to the smallest aligned size for
    which ``pack`` attention layers fill one Mamba state's slot;
  - attention-only models with a smaller page pack layers instead of scaling
    the block size, when the kind has enough layers.
  The price is more groups (fewer layers per group); the planner picks
  ``pack`` (see ``planner.py``).

Both return ``UnifiedSpecs``: the per-layer specs after unification, the
layers per slot of each spec, and the slot size. Pure functions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from hybridkv.specs import AttentionSpec, KVCacheSpec, MambaSpec
from hybridkv.specs.base import cdiv

STRATEGIES = ("vllm", "packed")


@dataclass(frozen=True)
class UnifiedSpecs:
    """Specs after unification. ``pack[spec]`` layers of ``spec`` fill a slot."""

    strategy: str
    specs: dict[str, KVCacheSpec]
    pack: dict[KVCacheSpec, int]
    slot_bytes: int
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for spec in set(self.specs.values()):
            used = self.pack[spec] * spec.page_size_bytes
            assert used <= self.slot_bytes, (spec, used, self.slot_bytes)

    @property
    def attention_block_size(self) -> int | None:
        """Block size of the largest-page attention spec (None: no attention)."""
        attn = [s for s in self.specs.values() if isinstance(s, AttentionSpec)]
        if not attn:
            return None
        return min(s.block_size for s in attn)


def _split(specs: dict[str, KVCacheSpec]) -> tuple[list[AttentionSpec], list[MambaSpec]]:
    attn: list[AttentionSpec] = []
    mamba: list[MambaSpec] = []
    for name, spec in specs.items():
        if isinstance(spec, AttentionSpec):
            attn.append(spec)
        elif isinstance(spec, MambaSpec):
            mamba.append(spec)
        else:
            raise ValueError(f"layer {name!r}: cannot plan memory for spec {spec!r}")
    return attn, mamba


def _per_token(spec: AttentionSpec) -> int:
    return spec.page_size_bytes // spec.block_size


def _layers_with(specs: dict[str, KVCacheSpec], spec: KVCacheSpec) -> list[str]:
    return [n for n, s in specs.items() if s == spec]


def _common_block_size(specs: dict[str, KVCacheSpec], attn: list[AttentionSpec]) -> int:
    sizes = {s.block_size for s in attn}
    if len(sizes) != 1:
        raise ValueError(
            f"attention layers must start from one block size, got {sorted(sizes)}; "
            "give all attention specs the same block_size (unification scales them)"
        )
    return sizes.pop()


def _scale_attention(
    specs: dict[str, KVCacheSpec], slot: int, allow_pack: bool
) -> tuple[dict[KVCacheSpec, KVCacheSpec], dict[KVCacheSpec, int]]:
    """Map each attention spec to one whose ``pack`` pages fill ``slot`` exactly.

    A page smaller than ``slot`` by an integer ratio is filled by packing as
    many layers as divide the ratio and the kind's layer count (packed), and by
    scaling the block size for the rest of the ratio.
    """
    counts = Counter(specs.values())
    new: dict[KVCacheSpec, KVCacheSpec] = {}
    pack: dict[KVCacheSpec, int] = {}
    for spec in counts:
        if not isinstance(spec, AttentionSpec):
            continue
        if slot % spec.page_size_bytes:
            pages = {n: s.page_size_bytes for n, s in specs.items() if isinstance(s, AttentionSpec)}
            big = max(pages, key=lambda n: pages[n])
            raise ValueError(
                f"attention layers cannot share one page size: layer "
                f"{_layers_with(specs, spec)[0]!r} has {spec.page_size_bytes}-byte pages and "
                f"layer {big!r} {pages[big]}-byte pages (block_size {spec.block_size}); "
                f"{slot} is not a multiple of {spec.page_size_bytes}, so no integer block "
                "size or packing makes them match"
            )
        ratio = slot // spec.page_size_bytes
        p = 1
        if allow_pack:
            p = max(d for d in range(1, ratio + 1) if ratio % d == 0 and d <= counts[spec])
        new[spec] = replace(spec, block_size=spec.block_size * (ratio // p))
        pack[new[spec]] = p
    return new, pack


def _pad_mamba(mamba: list[MambaSpec], slot: int, block_size: int) -> dict[KVCacheSpec, MambaSpec]:
    out: dict[KVCacheSpec, MambaSpec] = {}
    for spec in dict.fromkeys(mamba):
        padded = slot if slot != spec.state_size_bytes else None
        out[spec] = replace(spec, block_size=block_size, page_size_padded=padded)
    return out


def unify_vllm(specs: dict[str, KVCacheSpec], *, alignment: int = 16) -> UnifiedSpecs:
    """The baseline unification (one layer per slot), as vLLM does it."""
    return _unify(specs, "vllm", pack_attention=1, alignment=alignment)


def unify_packed(
    specs: dict[str, KVCacheSpec], *, pack_attention: int, alignment: int = 16
) -> UnifiedSpecs:
    """The packed alternative; ``pack_attention`` attention layers per slot.

    ``pack_attention`` matters only with Mamba layers (it sets how many
    attention layers fill one Mamba-sized slot); attention-only models pack as
    many small-page layers as their scale factor needs.
    """
    return _unify(specs, "packed", pack_attention=pack_attention, alignment=alignment)


def _unify(
    specs: dict[str, KVCacheSpec], strategy: str, *, pack_attention: int, alignment: int
) -> UnifiedSpecs:
    if not specs:
        raise ValueError("no layer has a KV cache or Mamba state: nothing to plan")
    if pack_attention < 1:
        raise ValueError(f"pack_attention must be >= 1, got {pack_attention}")
    attn, mamba = _split(specs)
    packed = strategy == "packed"
    notes: list[str] = []
    if not attn:
        slot = max(s.state_size_bytes for s in mamba)
        mapping: dict[KVCacheSpec, KVCacheSpec] = dict(_pad_mamba(mamba, slot, mamba[0].block_size))
        pack: dict[KVCacheSpec, int] = {}
    elif not mamba:
        slot = max(s.page_size_bytes for s in attn)
        mapping, pack = _scale_attention(specs, slot, allow_pack=packed)
        for old, new in mapping.items():
            if new.block_size != old.block_size:
                notes.append(
                    f"{old.kind} layers ({old.page_size_bytes} B pages) use block size "
                    f"{new.block_size} to fill the {slot} B slot"
                )
    else:
        bs0 = _common_block_size(specs, attn)
        per_token = {_per_token(s) for s in attn}
        if packed and len(per_token) > 1:
            raise ValueError(
                "packed unification with Mamba layers needs one attention page size, got "
                f"{sorted(per_token)} bytes per token; use unification='vllm'"
            )
        p = pack_attention if packed else 1
        state = max(s.state_size_bytes for s in mamba)
        align = max(alignment, bs0)
        bs = max(bs0, align * cdiv(state, align * max(per_token) * p))
        if bs > bs0:
            notes.append(
                f"attention block size raised from {bs0} to {bs} tokens so that {p} "
                f"attention layer page(s) hold a {state:,} B Mamba state"
            )
        slot = p * bs * max(per_token)
        raised = {
            n: replace(s, block_size=bs) if isinstance(s, AttentionSpec) else s
            for n, s in specs.items()
        }
        scaled: dict[KVCacheSpec, KVCacheSpec]
        if packed:
            scaled = {s: s for s in raised.values() if isinstance(s, AttentionSpec)}
            pack = dict.fromkeys(scaled, p)
        else:
            scaled, pack = _scale_attention(raised, slot, allow_pack=False)
        mapping = {old: scaled[raised[n]] for n, old in specs.items() if old in attn}
        mapping.update(_pad_mamba(mamba, slot, bs))
        if slot > state:
            notes.append(
                f"Mamba state {state:,} B padded to the {slot:,} B slot "
                f"(+{100 * (slot - state) / state:.1f}%)"
            )
    for new in mapping.values():
        pack.setdefault(new, 1)
    out = {name: mapping[spec] for name, spec in specs.items()}
    return UnifiedSpecs(strategy, out, pack, slot, tuple(notes))
