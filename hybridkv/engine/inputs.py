"""Turning ``generate``/``chat`` arguments into checked token ids and sampling params.

Everything is validated before any request is queued: a bad prompt or
parameter raises ``ValueError`` naming its index, and no state is left behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.token_ids import as_token_id_list

PromptType = str | Mapping[str, Any]


def prompt_ids(
    prompt: PromptType, k: int, tokenizer: Any, vocab_size: int, max_model_len: int
) -> tuple[list[int], str | None]:
    """Token ids (and the text, if any) of ``prompts[k]``."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(
                f"prompts[{k}] is text but the checkpoint has no tokenizer; pass "
                "{'prompt_token_ids': [...]} instead"
            )
        ids = tokenizer(prompt)["input_ids"]
        text: str | None = prompt
    elif isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
        text = prompt.get("prompt")
        try:  # the rules of hybridkv.Request: numpy ints are ids, bools are not
            ids = as_token_id_list(prompt["prompt_token_ids"], f"prompts[{k}]['prompt_token_ids']")
        except ValueError as e:
            raise ValueError(f"{e} (token ids must be ints in [0, {vocab_size}))") from None
    else:
        raise ValueError(
            f"prompts[{k}] must be a str or a dict with 'prompt_token_ids', got {prompt!r}"
        )
    if not ids:
        raise ValueError(f"prompts[{k}] is empty")
    if max(ids) >= vocab_size:
        bad = [t for t in ids if t >= vocab_size]
        raise ValueError(
            f"prompts[{k}]: token ids must be ints in [0, {vocab_size}), got {bad[:5]}"
        )
    if len(ids) > max_model_len:
        raise ValueError(
            f"prompts[{k}] has {len(ids)} tokens, more than max_model_len={max_model_len}"
        )
    return ids, text


def sampling_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt (a single one is shared; default: greedy, 16)."""
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    params = list(sampling_params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling_params for {n} prompts")
    for k, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params[{k}] must be a SamplingParams, got {p!r}")
    return params
