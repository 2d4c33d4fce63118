"""Input ids of a step scheduled while the step before it is in flight (async scheduling).

A decode request's next input is the token the step in flight samples: it exists only
on the device until that step's tokens are read back. The host writes every other
input (positions, slots, tables, the known token ids) and a placeholder 0 at that
token's place; ``put_pending`` then copies the token from the step in flight's sampled
ids on the device, ordered on the stream after that step's argmax, so nothing waits::

    step N (in flight)   its sampled ids on the device   [t_a, t_b]   (rows of a, b)
    step N+1 host ids    [c c c | 0 | 0]                 (a prompt's chunk, then a, b)
    put_pending          ids[3] = t_a, ids[4] = t_b

A scheduled request has a pending token when its slice reaches past its known tokens
(``start + num_tokens > core.num_tokens``: a decode of that one token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hybridkv.engine.scheduler import ScheduledRequest


@dataclass(frozen=True, slots=True)
class PendingTokens:
    """The step in flight's sampled ids, on the device (int64 ``[samplers]``), and each
    sampling request's row in them."""

    tokens: torch.Tensor
    rows: dict[str, int]


def new_token_ids(
    work: Sequence[ScheduledRequest], pending: PendingTokens | None
) -> tuple[list[int], list[int], list[int]]:
    """``work``'s new token ids in batch order (0 where a token is pending), the indices
    of the pending ones in that list, and their rows in ``pending.tokens``."""
    ids: list[int] = []
    at: list[int] = []
    rows: list[int] = []
    for s in work:
        core = s.request.core
        end = s.start + s.num_tokens
        ids.extend(core.all_token_ids[s.start : end])
        if end > core.num_tokens:  # its last token is sampled by the step in flight
            assert pending is not None and end == core.num_tokens + 1, s.request.request_id
            at.append(len(ids))
            rows.append(pending.rows[s.request.request_id])
            ids.append(0)
    return ids, at, rows


def put_pending(input_ids: torch.Tensor, at: torch.Tensor, rows: torch.Tensor,
                pending: PendingTokens) -> None:  # fmt: skip
    """``input_ids[at] = pending.tokens[rows]`` on the device (no host read; ``at`` and
    ``rows`` device int64 vectors of equal length)."""
    input_ids.index_copy_(0, at, pending.tokens.index_select(0, rows))
