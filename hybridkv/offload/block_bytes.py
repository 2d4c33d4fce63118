"""``BlockBytes``: the bytes of one device block's hit unit, as tensor views.

A group's unit for block ``b`` is, for each layer of the group in order, the
bytes that layer owns in block ``b``: an attention layer's K page then its V
page (adjacent in the raw buffer: one part), a Mamba layer's conv state then
its SSM state (one part up to the end of the SSM state: a padded page's tail
is not copied). Each part is a flat ``uint8`` view of the runner's KV buffer,
so a tier copies straight out of (and back into) the device buffers::

    raw buffer   | blk 0: L0 K V | L1 K V | ... | blk 1: L0 K V | L1 K V | ...
    parts(g, 1)                                   [ L0 K V ]  [ L1 K V ]  ...

``rows(g)`` gives the same bytes for every block at once, on the CPU: per
layer a ``[num_blocks, part bytes]`` numpy view whose row ``b`` is block
``b``'s part, so a batch of units is ``Rows(rows(g), block_ids)`` and moves
with one gather or scatter per layer (``HostTier.store_rows`` / ``load_rows``).
``widths`` are the largest part sizes of any group: a host slot that holds
any unit (``SlabMemory``).
"""

from __future__ import annotations

import torch

from hybridkv.planning import AttentionCache, KVCacheBuffers, MambaCache
from hybridkv.specs import KVCacheConfig
from hybridkv.tiers.rows import Rows


def _extent(first: torch.Tensor, last: torch.Tensor) -> tuple[int, int, int]:
    """``(start pointer of block 0, bytes from first's start to last's end, block stride
    in bytes)`` of a layer whose block-0 data runs from view ``first`` to view ``last``."""
    start = first[0].data_ptr()
    end = last[0].data_ptr() + last[0].numel() * last.element_size()
    return start, end - start, first.stride(0) * first.element_size()


class BlockBytes:
    """Per group, where each layer's bytes of a block lie in the raw KV buffers."""

    def __init__(self, config: KVCacheConfig, buffers: KVCacheBuffers) -> None:
        raw = [(b.data_ptr(), b.numel(), b) for b in buffers.buffers]
        self._layout: list[list[tuple[torch.Tensor, int, int, int]]] = []
        for group in config.kv_cache_groups:
            rows = []
            for name in group.layer_names:
                cache = buffers.layers[name]
                if isinstance(cache, AttentionCache):
                    start, nbytes, stride = _extent(cache.key, cache.value)
                elif isinstance(cache, MambaCache):
                    start, nbytes, stride = _extent(cache.conv, cache.ssm)
                else:  # pragma: no cover - the planner builds only these
                    raise ValueError(f"layer {name!r}: no unit layout for {type(cache).__name__}")
                base, size, buf = next((p, n, b) for p, n, b in raw if p <= start < p + n)
                assert nbytes <= stride and start - base + nbytes <= size, name
                rows.append((buf, start - base, stride, nbytes))
            self._layout.append(rows)
        #: Bytes of one unit per group.
        self.unit_bytes = [sum(r[3] for r in rows) for rows in self._layout]
        #: Per part index, the largest part of any group (a slot that holds any unit).
        self.widths = [
            max(rows[j][3] for rows in self._layout if j < len(rows))
            for j in range(max(len(rows) for rows in self._layout))
        ]
        n = config.num_blocks
        #: Per group, per layer: ``[num_blocks, part bytes]`` numpy views (CPU buffers only).
        self._rows: list[Rows] | None = None  # (each with no index: ``Rows.at`` gives one)
        if all(b.device.type == "cpu" for b in buffers.buffers):
            self._rows = [
                Rows(
                    tuple(
                        buf.as_strided((n, nbytes), (stride, 1), offset).numpy()
                        for buf, offset, stride, nbytes in rows
                    ),
                    (),
                )
                for rows in self._layout
            ]

    @property
    def has_rows(self) -> bool:
        """True when ``rows`` is available (the buffers are in CPU memory)."""
        return self._rows is not None

    def rows(self, group_id: int, block_ids: list[int]) -> Rows:
        """Group ``group_id``'s units of ``block_ids``, as rows of the KV buffers."""
        assert self._rows is not None, "rows() needs the KV buffers in CPU memory"
        return self._rows[group_id].at(block_ids)

    def parts(self, group_id: int, block_id: int) -> list[torch.Tensor]:
        """Group ``group_id``'s unit of block ``block_id``: one flat uint8 view per layer."""
        out = []
        for buf, offset, stride, nbytes in self._layout[group_id]:
            lo = offset + block_id * stride
            out.append(buf[lo : lo + nbytes])
        return out
