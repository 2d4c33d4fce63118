"""How long a context a model takes: ``max_model_len`` against the model's positions.

A model is trained for ``max_position_embeddings`` positions (a layout's
``max_model_len``). Asking for more is refused, as vLLM refuses it: past the
trained length a model's output is silently wrong, not an error. Like vLLM's
``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, an explicit override exists, but only for
models whose config scales RoPE (a ``rope_type`` other than ``default`` in
``rope_parameters`` / ``rope_scaling``): there a longer context is a
deliberate choice the scaling may support. Without RoPE scaling the override
is refused too, since nothing could make the extra positions meaningful.

Unlike vLLM, the scaling factor is not multiplied in: transformers configs
(Gemma 3, Llama 3/4) already state the scaled length in
``max_position_embeddings``, so multiplying would overstate it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OVERRIDE_HINT = "allow_long_max_model_len=True (--allow-long-max-model-len)"


def rope_scaling_types(config: Any) -> list[str]:
    """The non-default RoPE types of ``config`` (empty: no RoPE scaling).

    Reads ``rope_parameters`` (transformers 5; flat or keyed by layer type)
    and the older ``rope_scaling``.
    """
    found: list[str] = []
    for params in (getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)):
        if not isinstance(params, Mapping):
            continue
        nested = [p for p in params.values() if isinstance(p, Mapping)]
        for p in nested or [params]:
            kind = p.get("rope_type", p.get("type", "default")) or "default"
            if kind != "default" and kind not in found:
                found.append(str(kind))
    return found


def check_max_model_len(
    requested: int,
    model_max: int,
    *,
    model: str,
    rope_scaling: list[str] | None = None,
    allow_long: bool = False,
    limit_name: str = "max_position_embeddings",
) -> int:
    """``requested`` if the model takes it, else ``ValueError`` (see the module docstring).

    ``model_max``: the model's trained positions; ``model`` names it in the
    message; ``rope_scaling``: its non-default RoPE types (None: unknown, as
    for a YAML layout, where no override exists); ``allow_long``: the override;
    ``limit_name``: where ``model_max`` comes from, for the message.
    """
    if requested <= model_max:
        return requested
    head = (
        f"max_model_len={requested} exceeds {model}'s {model_max} positions "
        f"({limit_name}): generation past them is silently wrong"
    )
    if rope_scaling is None:
        raise ValueError(f"{head}; lower max_model_len")
    if not rope_scaling:
        if allow_long:
            raise ValueError(
                f"{head}, and the model has no RoPE scaling, so the override "
                f"{OVERRIDE_HINT} does not apply; lower max_model_len"
            )
        raise ValueError(f"{head}; lower max_model_len")
    if not allow_long:
        raise ValueError(
            f"{head}; the model scales RoPE ({', '.join(rope_scaling)}): if it supports the "
            f"longer context, pass {OVERRIDE_HINT}"
        )
    return requested
