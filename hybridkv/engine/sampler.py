"""Token sampling from a step's logits (greedy, temperature, top-k, top-p), with
log-probabilities.

Rows of requests whose params process logits (``min_tokens``, ``logit_bias``,
penalties: ``hybridkv.engine.penalties``) are processed first, in fp32.
Greedy rows take the argmax (ties: the lowest id): unprocessed ones compared
in the logits' own dtype (bf16 -> fp32 is exact, so no fp32 copy is needed),
found by the ``greedy`` op the engine passes (its kernel backend's: C on
``native``). Other rows are sampled in fp32 (an exponential race, ``_draw``)
from ``softmax(row / temperature)`` restricted to the ``top_k`` largest logits
and then to the smallest set whose probability reaches ``top_p``; a request
with a seed draws from its own generator, which lives on the CPU whatever the
engine's device (the draw is made there, from the probabilities computed on
the device).

A request with ``logprobs=k`` gets, per token, the ``log_softmax`` of its raw
row (vLLM's default ``raw_logprobs``: before processing and temperature) at the
sampled token and at the ``k`` most likely ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.outputs import Logprob
from hybridkv.engine.penalties import process_logits
from hybridkv.kernels.torch_backend import max_indices

#: ``logits [N, V]`` -> int64 ``[N]``, each row's first maximal index.
GreedyOp = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Samples:
    """One step's draws: ``tokens[i]`` for row ``i``, and its log-probabilities
    (``None`` where the request did not ask for them)."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob] | None]


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, -1)
        # Drop a token when the mass before it already reaches top_p (keep >= 1).
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def token_logprobs(row: torch.Tensor, token: int, k: int) -> dict[int, Logprob]:
    """``{token id: Logprob}`` of ``log_softmax(row)`` (fp32): ``token`` first, then
    the ``k`` most likely (ranks from 1; a token in both appears once)."""
    lp = torch.log_softmax(row.float(), -1)
    chosen = lp[token]
    out = {token: Logprob(float(chosen), int((lp > chosen).sum()) + 1)}
    if k:
        values, ids = torch.topk(lp, min(k, lp.shape[-1]))
        for rank, (v, t) in enumerate(zip(values.tolist(), ids.tolist(), strict=True), 1):
            out.setdefault(t, Logprob(v, rank))
    return out


def _draw(req: EngineRequest, row: torch.Tensor) -> int:
    """A token drawn from the row's filtered distribution by an exponential race:
    ``argmax(p_i / E_i)`` with ``E_i ~ Exp(1)`` picks ``i`` with probability ``p_i``
    (vLLM's way; 3x faster than ``torch.multinomial`` over a 262k vocabulary)."""
    p = req.params
    probs = torch.softmax(_filter(row.float() / p.temperature, p.top_k, p.top_p), -1)
    if req.generator is not None:
        # A seed's generator lives on the CPU: the draw is made there, so a seed
        # gives the same stream of draws on every device.
        probs = probs.to(req.generator.device)
    race = torch.empty_like(probs).exponential_(generator=req.generator)
    return int(torch.argmax(probs / race))


def plainly_greedy(requests: Sequence[EngineRequest]) -> bool:
    """Every request is greedy, processes no logits and asks for no log-probabilities:
    its tokens are one ``greedy`` call's result, with nothing computed on the host."""
    params = {id(r.params): r.params for r in requests}.values()  # a batch shares a few
    return all(p.greedy and not p.processes_logits and p.logprobs is None for p in params)


def sample(
    logits: torch.Tensor, requests: Sequence[EngineRequest], greedy_op: GreedyOp = max_indices
) -> Samples:
    """One token per row of ``logits`` ``[N, V]`` (row ``i`` for ``requests[i]``);
    unprocessed greedy rows from ``greedy_op`` (the engine's ``kernel_backend.greedy``).
    When every request is plainly greedy (no processing, no log-probabilities) that is
    one call and one read of its ``[N]`` result, with no Python per row."""
    if plainly_greedy(requests):
        argmax: list[int] = greedy_op(logits).tolist()
        return Samples(argmax, [None] * len(argmax))
    params = {id(r.params): r.params for r in requests}.values()  # a batch shares a few
    fast = any(p.greedy and not p.processes_logits for p in params)
    greedy = greedy_op(logits).tolist() if fast else []
    tokens: list[int] = []
    logprobs: list[dict[int, Logprob] | None] = []
    for i, req in enumerate(requests):
        p = req.params
        row = logits[i]
        if p.processes_logits:
            core = req.core
            row = process_logits(
                row, p, core.prompt_token_ids, core.output_token_ids, req.stop_token_ids
            )
            token = int(torch.argmax(row)) if p.greedy else _draw(req, row)
        else:
            token = int(greedy[i]) if p.greedy else _draw(req, row)
        tokens.append(token)
        wanted = p.logprobs is not None
        logprobs.append(token_logprobs(logits[i], token, p.logprobs or 0) if wanted else None)
    return Samples(tokens, logprobs)
