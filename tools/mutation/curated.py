"""Hand-written mutants: slips the generated operators do not make.

One entry per mutation: the file, the exact original text (it must occur
exactly once in the file; a unit test checks every entry), the replacement and
a one-line description. ``tests`` overrides the file's test map (targets.py)
when the mutant needs other tests. Add an entry when a review finds a bug the
generated set would not have modelled; the first five are the survivors of the
hand-made mutation round of issue 20.
"""

from __future__ import annotations

from .mutant import Mutant


def _m(file: str, original: str, replacement: str, description: str) -> Mutant:
    return Mutant(file, original, replacement, description, f"{file}::curated::{description}")


CURATED: tuple[Mutant, ...] = (
    _m(
        "hybridkv/managers/base.py",
        "n -= list(map(_ref_cnt, blocks[lo:hi])).count(1)",
        "n -= hi - lo",
        "a skipped block counts as freed even when another request holds it",
    ),
    _m(
        "hybridkv/engine/scheduler.py",
        "ids[g][s.start // bs : last]",
        "ids[g][s.start // bs + 1 : last]",
        "the block a chunk starting mid-block fills is not pending",
    ),
    _m(
        "hybridkv/engine/scheduler.py",
        "if not preempted:\n            budget = self._admit(",
        "if True:\n            budget = self._admit(",
        "waiting requests are admitted in a step that preempted",
    ),
    _m(
        "hybridkv/planning/grouping.py",
        "return spec.state_size_bytes if isinstance(spec, MambaSpec) else spec.page_size_bytes",
        "return spec.page_size_bytes",
        "Mamba padding counts as used bytes in the grouping's waste",
    ),
    _m(
        "hybridkv/core/hashing.py",
        "if offset < end and offset + length > start:",
        "if offset < end and offset + length >= start:",
        "a multimodal range ending at a block's start overlaps that block",
    ),
)
