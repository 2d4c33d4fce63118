"""``RopeTable``: a RoPE form's cos/sin for every position, computed once, gathered per step.

Without a table each step computes cos/sin at its positions (``to``, ``mul``, ``cat``,
``cos``, ``sin``, ``to``...: about 7 kernels per RoPE base, issue 47). With one, the
step's cos/sin is one ``index_select`` of the rows at its positions::

    table [max_positions, 2, *shape]     row p = (cos(p), sin(p)) of the form's cos_sin
    step  table.index_select(0, positions) -> [T, 2, *shape] -> cos [T, *shape], sin

The table is made by the form's own ``cos_sin`` over ``arange(max_positions)``
(the same elementwise ops and dtypes as a step's), so a gathered row is bit-identical
to computing it at that position. One table per ``cos_sin`` arguments (e.g. the dtype),
built on first use on the positions' device, kept for the model's life. Memory:
``2 x max_positions x rotary_dim x itemsize`` bytes per base and dtype (Gemma 3 at
32,768 positions, head 256, bf16: 32 MiB per base; fp32 doubles it).

A form whose table could pass ``MAX_TABLE_BYTES`` gets none (``attach_rope_tables``
skips it: its steps compute cos/sin at their positions, as without tables, with the
same values): Llama 4's 10M positions would take gigabytes.

Positions must be below ``max_positions`` (the engine's ``max_model_len``, which the
scheduler never exceeds). An eager step checks it against its host-side context lengths
(no read-back of the device positions) and raises ``ValueError``; a graphed step does
not check, so there an out-of-range index is ``index_select``'s own error (a device-side
assert on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

CosSin = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: The largest table a form gets: 256 MiB, room for Gemma 3 4B's 131,072 positions of a
#: 256-wide head in fp32 (half that in bf16); larger ones are left to per-step compute.
MAX_TABLE_BYTES = 256 << 20


def table_fits(max_positions: int, rotary_dim: int) -> bool:
    """Whether a table of ``max_positions`` x ``rotary_dim`` cos and sin, in fp32 (the
    widest dtype a table is built in), stays within ``MAX_TABLE_BYTES``."""
    return 2 * max_positions * rotary_dim * 4 <= MAX_TABLE_BYTES


class RopeTable:
    """cos/sin of positions ``0 .. max_positions - 1`` for one RoPE form (see module doc).

    Shared by every layer with the same form and parameters (``attach_rope_tables``).
    """

    def __init__(self, max_positions: int) -> None:
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        self.max_positions = max_positions
        self._tables: dict[tuple[object, ...], torch.Tensor] = {}

    def table(self, cos_sin: CosSin, device: torch.device, *args: object) -> torch.Tensor:
        """The stacked table ``[max_positions, 2, *shape]`` for ``cos_sin(..., *args)``."""
        found = self._tables.get(args)
        if found is None:
            every = torch.arange(self.max_positions, dtype=torch.int64, device=device)
            cos, sin = cos_sin(every, *args)
            found = self._tables[args] = torch.stack((cos, sin), dim=1)
        return found

    def gather(
        self, positions: torch.Tensor, cos_sin: CosSin, *args: object, check: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at ``positions`` ``[T]`` (views of one gathered ``[T, 2, ...]``).

        ``check``: raise ``ValueError`` on a position past the table (reads the largest
        position back to the host: not in a graphed step).
        """
        if check and positions.numel():
            self.require(int(positions.max()))
        rows = self.table(cos_sin, positions.device, *args).index_select(0, positions)
        return rows[:, 0], rows[:, 1]

    def require(self, high: int) -> None:
        """Raise ``ValueError`` if position ``high`` is past the table."""
        if high >= self.max_positions:
            raise ValueError(
                f"position {high} is past the RoPE table ({self.max_positions} positions, "
                "the engine's max_model_len): raise max_model_len"
            )

    def nbytes(self) -> int:
        """Bytes held by the tables built so far."""
        return sum(t.numel() * t.element_size() for t in self._tables.values())

    def check_integrity(self) -> None:
        """Every table has one row of (cos, sin) per position."""
        for args, t in self._tables.items():
            assert t.shape[:2] == (self.max_positions, 2), (args, tuple(t.shape))
