"""``DeferredWrites``: a stand-in device whose steps write the KV cache late (and
``fail_at_launch``: one that is lost at a given launch).

A CPU step has written its KV cache when ``runner.execute`` returns, so a tier copy
issued too early (before the step in flight has run) still reads or writes the right
bytes there: a race on a GPU is invisible on the CPU. This stand-in makes it visible.
It wraps an async engine's ``runner.execute`` and fence (``AsyncSteps.record``): a
step computes as usual (its logits are right), but the bytes it wrote into the blocks
of its requests are put back as they were and kept aside; they land when the step's
fence is waited (the engine reads its tokens, or a tier copy waits for it:
``hybridkv.offload.inflight_step``) or when the next step starts (a stream runs in
order)::

    execute(N)      run N; its blocks' changed bytes kept aside, the old ones put back
    fence(N).wait   N's bytes (and those of every step before it) land
    execute(N+1)    every step before it lands first, then as above

So a copy out of a block N wrote, issued before N's fence, reads the bytes from before
N (stale); a load into a block N still writes is overwritten when N lands. Only the
bytes a step changed land (a mask per block part), so a copy that wrote a block
meanwhile keeps what the step did not write. The parts are those of the step's
requests' blocks (``BlockBytes.parts``, every group; block 0, the null block, is
left alone): the blocks a step writes, and never blocks a load is writing (those
are held by the load until the request that adopts them is scheduled).
"""

from __future__ import annotations

from typing import Any

import torch

from hybridkv.engine import LLM

#: One kept write: a part of a block, the mask of the bytes the step changed, and them.
Write = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class DeferredFence:
    """The fence of step ``index``: ``wait`` lands it and every step before it."""

    def __init__(self, device: DeferredWrites, index: int) -> None:
        self.device = device
        self.index = index

    def wait(self) -> None:
        self.device.land(self.index)


class DeferredWrites:
    """The stand-in device on ``llm`` (async scheduling and a tier: module docstring)."""

    def __init__(self, llm: LLM) -> None:
        assert llm.async_steps is not None and llm.tiers is not None
        assert llm.device.type == "cpu", "the stand-in replaces a CPU engine's device"
        self.manager = llm.manager
        self.block_bytes = llm.tiers.block_bytes
        self.kept: list[tuple[int, list[Write]]] = []  # (step index, its writes), in order
        self.steps = 0
        #: Bytes that landed late (the stand-in did defer something).
        self.landed_bytes = 0
        execute = llm.runner.execute

        def deferred(work: Any, pending: Any = None) -> Any:
            self.land(self.steps)  # the steps before it run first
            parts = self._parts(work)
            before = [p.clone() for p in parts]
            logits = execute(work, pending)
            writes = []
            for part, old in zip(parts, before, strict=True):
                mask = part != old
                if bool(mask.any()):
                    writes.append((part, mask, part[mask].clone()))
                    part[mask] = old[mask]
            self.steps += 1
            self.kept.append((self.steps, writes))
            return logits

        llm.runner.execute = deferred  # type: ignore[method-assign]
        llm.async_steps.record = lambda: DeferredFence(self, self.steps)

    def _parts(self, work: Any) -> list[torch.Tensor]:
        """Every part of every non-null block of the step's requests, once each."""
        seen: set[tuple[int, int]] = set()
        parts: list[torch.Tensor] = []
        for s in work:
            for gid, ids in enumerate(self.manager.get_block_ids(s.request.request_id)):
                for bid in ids:
                    if bid and (gid, bid) not in seen:
                        seen.add((gid, bid))
                        parts.extend(self.block_bytes.parts(gid, bid))
        return parts

    def land(self, index: int) -> None:
        """The writes of steps up to ``index`` land, oldest first."""
        while self.kept and self.kept[0][0] <= index:
            _, writes = self.kept.pop(0)
            for part, mask, new in writes:
                part[mask] = new
                self.landed_bytes += int(mask.sum())


def fail_at_launch(llm: LLM, k: int) -> Any:
    """Make ``llm``'s ``k``-th launch from now raise ``RuntimeError("device lost")``;
    returns the ``runner.execute`` it wraps (to put back)."""
    execute, calls = llm.runner.execute, [0]

    def failing(work: Any, pending: Any = None) -> Any:
        calls[0] += 1
        if calls[0] == k:
            raise RuntimeError("device lost")
        return execute(work, pending)

    llm.runner.execute = failing  # type: ignore[method-assign]
    return execute
