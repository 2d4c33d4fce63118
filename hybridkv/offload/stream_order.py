"""``StreamOrder``: the engine's next work ordered after a tier copy, not the host.

A tier copy on CUDA runs on the host tier's copy stream and completes with a
CUDA event (``tiers/torch_memory.EventCompletion``). Whoever must not run
before it (the step that reads a loaded block; the step that overwrites a
block a store is still reading) need not block the host: the *current*
stream waits on the event (``wait_event``), and every kernel queued on it
afterwards runs after the copy. The transfer itself stays in flight (its
tier entry pinned) until the event has passed and someone looks
(``Transfer.done``, the tier's ``poll``). On the CPU, and for a copy that is
not a stream event (a thread job, a disk read), the host waits for it
(``Transfer.wait``), as before.

``current_stream`` is the consumer's stream as a callable (on CUDA
``torch.cuda.current_stream(device)``; None on the CPU), so the rule is
tested on the CPU with a fake stream and fake events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridkv.tiers import Transfer
from hybridkv.tiers.torch_memory import EventCompletion


class StreamOrder:
    """Order the consumer after a transfer (module docstring)."""

    def __init__(self, current_stream: Callable[[], Any] | None = None) -> None:
        self.current_stream = current_stream
        #: Transfers the consumer stream was made to wait on (not waited by the host).
        self.stream_waits = 0

    def orders(self, transfer: Transfer) -> bool:
        """True when the consumer can wait for ``transfer`` on its stream."""
        return self.current_stream is not None and isinstance(transfer.completion, EventCompletion)

    def ready(self, transfer: Transfer) -> bool:
        """True when work that needs ``transfer`` may be queued now: it is done,
        or the consumer's stream can wait for it."""
        return transfer.done() or self.orders(transfer)

    def after(self, transfer: Transfer) -> bool:
        """Make the consumer's next work run after ``transfer``: the stream waits
        on its event (CUDA), else the host waits. True if its copy succeeded (a
        stream copy cannot fail once queued)."""
        if transfer.done():
            return transfer.error is None
        if self.orders(transfer):
            assert self.current_stream is not None
            completion = transfer.completion
            assert isinstance(completion, EventCompletion)
            self.current_stream().wait_event(completion.event)
            self.stream_waits += 1
            return True
        return transfer.wait()
