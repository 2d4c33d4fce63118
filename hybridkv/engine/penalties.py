"""Logit processing before sampling: ``min_tokens``, ``logit_bias``, penalties.

vLLM's semantics and order (``SamplingParams`` documents each field)::

    row = logits (fp32)
    row[stop ids]  = -inf                    while num_output < min_tokens
    row[t]        += logit_bias[t]
    row[t]         = row[t] / r if row[t] > 0 else row[t] * r
                                             for t in prompt or output (r: repetition_penalty)
    row[t]        -= frequency_penalty * count_out(t)
    row[t]        -= presence_penalty * (count_out(t) > 0)

Greedy requests take the argmax of the processed row; sampled ones apply
temperature and top-k/top-p to it. Log-probabilities are taken from the raw
logits, not from this row (``hybridkv.engine.logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybridkv.engine.sampling_params import SamplingParams


def process_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    stop_ids: frozenset[int],
) -> torch.Tensor:
    """The processed fp32 copy of one row of ``logits`` ``[V]`` (module docstring).

    ``stop_ids``: the request's stop tokens (``stop_token_ids``, plus the end of
    sequence unless ``ignore_eos``), masked while ``min_tokens`` is not reached.
    """
    row = logits.float().clone()
    vocab = row.shape[-1]
    if len(output_ids) < params.min_tokens and stop_ids:
        row[torch.tensor(sorted(t for t in stop_ids if t < vocab), dtype=torch.long)] = -torch.inf
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        row.index_add_(0, ids, torch.tensor(list(params.logit_bias.values())))
    if params.repetition_penalty != 1 or params.frequency_penalty or params.presence_penalty:
        out = torch.tensor(list(output_ids), dtype=torch.long)
        counts = torch.bincount(out, minlength=vocab).to(row.dtype)
        if params.repetition_penalty != 1:
            seen = counts > 0
            seen[torch.tensor(list(prompt_ids), dtype=torch.long)] = True
            r = params.repetition_penalty
            row = torch.where(seen, torch.where(row > 0, row / r, row * r), row)
        row -= params.frequency_penalty * counts
        row -= params.presence_penalty * (counts > 0).to(row.dtype)
    return row
