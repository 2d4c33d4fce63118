"""``TritonTiles``: the Triton attention kernel's launch choices, for tuning runs.

The launcher (``launcher.py``) picks rows per program, keys per iteration, warps,
stages and split-KV segments by the rules of ``launch_rules.py``. ``unified_attention(...,
tiles=TritonTiles(...))`` overrides some of them for one call, so that
``research/tune_attention.py`` can time the alternatives on a GPU without
editing the launcher; ``None`` fields keep the rule. Every choice computes the
same attention (the tuning script checks it); only the speed changes. The torch
and native backends have no tiles and ignore it, as they ignore
``num_segments``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.kernels.tile_checks import power_of_two, stage_count


@dataclass(frozen=True)
class TritonTiles:
    """Overrides of the launcher's rules (``launch_rules.py``); ``None`` keeps a rule.

    - ``block_m``: rows per program (query tokens x the query heads of one KV
      head); at least 16 (``tl.dot``) and at least that head count, rounded up
      to a power of two (the launcher raises otherwise);
    - ``tile_n``: keys per loop iteration;
    - ``num_warps``, ``num_stages``: Triton's launch options;
    - ``min_tiles_per_segment``: the automatic split-KV's shortest segment, in
      tiles of ``tile_n`` keys, instead of the span rule's 2048 keys and the fill
      rule's ``MIN_SEGMENT_TILES`` (``num_segments=`` still forces a split);
    - ``longest_first``: dispatch the q blocks last first, KV heads inner (a causal
      prompt's longest programs first: ``research/prefill_attention_work.py`` puts the
      tail of 1 x 2k's launch order at 1.66x its bound, 1.00x longest first); the
      rule is False until a lease times it (``research/tune_attention.py``).
    """

    block_m: int | None = None
    tile_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    min_tiles_per_segment: int | None = None
    longest_first: bool | None = None

    def __post_init__(self) -> None:
        power_of_two("block_m", self.block_m, 16, 256)
        power_of_two("tile_n", self.tile_n, 16, 256)
        power_of_two("num_warps", self.num_warps, 1, 16)
        stage_count(self.num_stages)
        m = self.min_tiles_per_segment
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"min_tiles_per_segment: must be an integer >= 1, got {m!r}")
        if self.longest_first is not None and not isinstance(self.longest_first, bool):
            raise ValueError(
                f"longest_first: must be True, False or None, got {self.longest_first!r}"
            )
