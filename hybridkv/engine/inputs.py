"""Turning ``generate``/``chat`` arguments into checked prompts and engine requests.

Everything is validated before any request is queued: a bad prompt or
parameter raises ``ValueError`` naming its index, and no state is left behind.

A prompt is text, or a dict in vLLM's shapes: ``{"prompt": text}`` or
``{"prompt_token_ids": [...]}`` (optionally with its ``"prompt"`` text), each
with an optional ``"cache_salt"`` (a non-empty str: the prompt only hits cache
blocks stored under the same salt). Any other key is an error.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybridkv.core.token_ids import as_token_id_list
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams

PromptType = str | Mapping[str, Any]
_PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "cache_salt"})


@dataclass(frozen=True)
class Prompt:
    """A checked prompt: token ids, its text (if any) and its cache salt."""

    token_ids: list[int]
    text: str | None = None
    cache_salt: str | None = None


def _salt(prompt: Mapping[str, Any], k: int) -> str | None:
    salt = prompt.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(f"prompts[{k}]['cache_salt'] must be a non-empty str, got {salt!r}")
    return salt


def prompt_ids(
    prompt: PromptType, k: int, tokenizer: Any, vocab_size: int, max_model_len: int
) -> Prompt:
    """The checked ``prompts[k]``."""
    salt = None
    if isinstance(prompt, Mapping):
        unknown = sorted(set(prompt) - _PROMPT_KEYS, key=str)
        if unknown:
            raise ValueError(
                f"prompts[{k}] has unknown keys {unknown}; a prompt dict takes "
                f"{sorted(_PROMPT_KEYS)}"
            )
        salt = _salt(prompt, k)
        if "prompt_token_ids" not in prompt and isinstance(prompt.get("prompt"), str):
            prompt = prompt["prompt"]
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
            f"prompts[{k}] must be a str or a dict with 'prompt' or 'prompt_token_ids', "
            f"got {prompt!r}"
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
    return Prompt(ids, text, salt)


def sampling_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int, vocab_size: int
) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt (a single one is shared; default: greedy, 16);
    ``logit_bias`` ids are checked against the vocabulary."""
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        params = [sampling_params] * n
    else:
        params = list(sampling_params)
        if len(params) != n:
            raise ValueError(f"got {len(params)} sampling_params for {n} prompts")
    for k, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params[{k}] must be a SamplingParams, got {p!r}")
        bad = [t for t in p.logit_bias or () if t >= vocab_size]
        if bad:
            raise ValueError(f"logit_bias: token ids must be in [0, {vocab_size}), got {bad[:5]}")
    return params


def engine_requests(
    prompts: Sequence[Prompt],
    params: Sequence[SamplingParams],
    ids: itertools.count[int],
    **common: Any,
) -> list[list[EngineRequest]]:
    """Per prompt, its ``n`` engine requests (sample ``i`` with ``params.for_sample(i)``),
    in queueing order; ``common`` goes to every ``EngineRequest``."""
    return [
        [
            EngineRequest(
                str(next(ids)),
                prompt.token_ids,
                p.for_sample(i),
                prompt=prompt.text,
                cache_salt=prompt.cache_salt,
                **common,
            )
            for i in range(p.n)
        ]
        for prompt, p in zip(prompts, params, strict=True)
    ]
