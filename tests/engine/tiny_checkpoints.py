"""Tiny random Hugging Face checkpoints of each family, saved like real ones.

Windows and chunks are smaller than the test prompts and not multiples of the
engine's block size (4 in the tests). ``initializer_range`` is raised so that
logits are spread out and greedy choices are not near-ties. Random models get
``generation_config.eos_token_id = None`` so they always produce the asked
number of tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

COMMON: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
)  # fmt: skip
WINDOW = 7


def gemma3_config(**overrides: Any) -> Any:
    from transformers import Gemma3TextConfig

    kw = dict(COMMON, head_dim=16, num_hidden_layers=4, sliding_window=WINDOW,
              layer_types=["sliding_attention"] * 3 + ["full_attention"],
              query_pre_attn_scalar=16, initializer_range=0.02)  # fmt: skip
    kw.update(overrides)
    return Gemma3TextConfig(**kw)


def save_checkpoint(config: Any, path: Path, *, seed: int = 0) -> Path:
    """Build the config's causal LM with random weights and ``save_pretrained`` it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.save_pretrained(path)
    return path


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of ``prompt`` and its per-step logits ``[n, V]``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, torch.cat(out.logits).float()
