"""Config fields shared by the tests' tiny Hugging Face models (no torch import)."""

from __future__ import annotations

from typing import Any

#: The tiny Jamba's layer pattern and Mamba sizes: attention on odd layers, a
#: 2-expert MoE on odd layers, d_state 8 (tests/engine/tiny_checkpoints.py,
#: the shipped tiny-jamba layout and the mamba-ssm comparison use the same).
TINY_JAMBA_LAYERS: dict[str, Any] = dict(
    attn_layer_period=2,
    attn_layer_offset=1,
    expert_layer_period=2,
    expert_layer_offset=1,
    num_experts=2,
    num_experts_per_tok=1,
    mamba_d_state=8,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_dt_rank=8,
)
