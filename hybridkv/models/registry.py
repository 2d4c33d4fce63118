"""Which model class runs which Hugging Face architecture (one place).

``resolve_architecture(hf_config)`` returns the family class for the config's
``architectures[0]`` (falling back on its ``model_type``) and the text config
that class reads (multimodal wrappers are unwrapped). An unknown architecture
raises ``UnsupportedModelError`` listing the supported ones.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from hybridkv.models.base import CausalLM

#: architecture -> (module, class, multimodal wrapper?)
ARCHITECTURES: dict[str, tuple[str, str, bool]] = {
    "Gemma3ForCausalLM": ("hybridkv.models.gemma3", "Gemma3ForCausalLM", False),
    "Gemma3ForConditionalGeneration": ("hybridkv.models.gemma3", "Gemma3ForCausalLM", True),
    "Llama4ForCausalLM": ("hybridkv.models.llama4", "Llama4ForCausalLM", False),
    "Llama4ForConditionalGeneration": ("hybridkv.models.llama4", "Llama4ForCausalLM", True),
    "JambaForCausalLM": ("hybridkv.models.jamba", "JambaForCausalLM", False),
    "BambaForCausalLM": ("hybridkv.models.bamba", "BambaForCausalLM", False),
    "Cohere2ForCausalLM": ("hybridkv.models.cohere2", "Cohere2ForCausalLM", False),
    "MistralForCausalLM": ("hybridkv.models.mistral", "MistralForCausalLM", False),
    "MinistralForCausalLM": ("hybridkv.models.mistral", "MistralForCausalLM", False),
    "GraniteMoeHybridForCausalLM": (
        "hybridkv.models.granite",
        "GraniteMoeHybridForCausalLM",
        False,
    ),
}

_BY_MODEL_TYPE = {
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "llama4_text": "Llama4ForCausalLM",
    "llama4": "Llama4ForConditionalGeneration",
    "jamba": "JambaForCausalLM",
    "bamba": "BambaForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "ministral": "MinistralForCausalLM",
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture has no model class here."""


def architecture_name(architectures: Any, model_type: Any) -> str:
    """The supported architecture a config names (``architectures``, else its
    ``model_type``); ``UnsupportedModelError`` listing the supported ones if none."""
    archs = [str(a) for a in architectures] if isinstance(architectures, (list, tuple)) else []
    name = next((a for a in archs if a in ARCHITECTURES), None)
    if name is None and not archs:
        name = _BY_MODEL_TYPE.get(str(model_type))
    if name is None:
        raise UnsupportedModelError(
            f"architecture {archs or model_type!r} is not supported; supported: "
            + ", ".join(sorted(ARCHITECTURES))
        )
    return name


def check_architecture(config_file: Path) -> None:
    """Raise ``UnsupportedModelError`` if ``config_file``'s raw JSON names no supported
    architecture, before transformers parses it (some transformers versions fail on
    an unsupported model's fields first, with a less useful error). An unreadable
    file passes: ``read_hf_config`` says what is wrong with it."""
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    if isinstance(raw, dict):
        architecture_name(raw.get("architectures"), raw.get("model_type"))


def resolve_architecture(hf_config: Any) -> tuple[type[CausalLM], Any]:
    """The model class and the text config it reads (see the module docstring)."""
    name = architecture_name(
        list(getattr(hf_config, "architectures", None) or []),
        getattr(hf_config, "model_type", None),
    )
    module, cls_name, wrapper = ARCHITECTURES[name]
    cls = getattr(importlib.import_module(module), cls_name)
    text = hf_config.get_text_config() if wrapper else hf_config
    if text.model_type not in cls.model_types:
        raise UnsupportedModelError(
            f"{name}: text config model_type {text.model_type!r} is not one of {cls.model_types}"
        )
    return cls, text
