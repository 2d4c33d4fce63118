"""Token sampling from a step's logits (greedy, temperature, top-k, top-p).

Greedy rows take the argmax (ties: the lowest id), compared in the logits'
own dtype (bf16 -> fp32 is exact, so no fp32 copy is needed), found by the
``greedy`` op the engine passes (its kernel backend's: C on ``native``).
Other rows are sampled in fp32 from ``softmax(logits / temperature)``
restricted to the ``top_k`` largest logits and then to the smallest set
whose probability reaches ``top_p``; a request with a seed draws from its own
generator, which lives on the CPU whatever the engine's device (the draw is
made there, from the probabilities computed on the device).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hybridkv.engine.engine_request import EngineRequest
from hybridkv.kernels.torch_backend import max_indices

#: ``logits [N, V]`` -> int64 ``[N]``, each row's first maximal index.
GreedyOp = Callable[[torch.Tensor], torch.Tensor]


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


def sample(
    logits: torch.Tensor, requests: Sequence[EngineRequest], greedy_op: GreedyOp = max_indices
) -> list[int]:
    """One token per row of ``logits`` ``[N, V]`` (row ``i`` for ``requests[i]``);
    greedy rows from ``greedy_op`` (the engine's ``kernel_backend.greedy``)."""
    greedy = greedy_op(logits).tolist()
    out = []
    for i, req in enumerate(requests):
        p = req.params
        if p.greedy:
            out.append(int(greedy[i]))
            continue
        row = _filter(logits[i].float() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, -1)
        if req.generator is not None:
            # A seed's generator lives on the CPU: the draw is made there, so a seed
            # gives the same stream of draws on every device.
            probs = probs.to(req.generator.device)
        out.append(int(torch.multinomial(probs, 1, generator=req.generator).item()))
    return out
