"""The Llama 4 pieces that are easy to get subtly wrong, one by one.

Query temperature positions (``p + 1``, floor), the interleaved RoPE pairs,
routing scores on the experts' inputs, which layers are chunked (must agree
with the planner's layout), and the checkpoint names of both architectures.
transformers' own modules are the reference where they exist. (Imports avoid
``hybridkv.models.base``/``loader`` first: importing either before
``hybridkv.engine`` is a circular import today.)
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from tiny_checkpoints import llama4_config

from hybridkv.layouts.hf_families import read_llama4_text
from hybridkv.layouts.kinds import ChunkedLocalLayer, FullAttentionLayer
from hybridkv.models.llama4 import (
    InterleavedRotary,
    Llama4Attention,
    Llama4ForCausalLM,
    rope_parameters,
    temperature_scales,
)
from hybridkv.models.llama4_moe import Llama4MoE


def _attention(model: Llama4ForCausalLM) -> list[Llama4Attention]:
    return [m for m in model.modules() if isinstance(m, Llama4Attention)]


def test_temperature_steps_at_every_floor_scale_multiple_of_p_plus_1() -> None:
    positions = torch.tensor([0, 1, 2, 3, 4, 6, 7, 8, 11, 12, 100])
    steps = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 25]  # floor((p + 1) / 4)
    want = torch.tensor([1 + 0.5 * math.log1p(s) for s in steps])
    got = temperature_scales(positions, floor_scale=4, attn_scale=0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_temperature_only_on_nope_layers_and_qk_norm_only_on_rope_layers() -> None:
    with torch.device("meta"):
        model = Llama4ForCausalLM(llama4_config())
    attn = _attention(model)
    assert [a.temperature for a in attn] == [None, None, None, (4.0, 0.5)]
    assert [a.rotary is not None for a in attn] == [True, True, True, False]
    assert [a.qk_norm_eps is not None for a in attn] == [True, True, True, False]
    off = Llama4ForCausalLM(llama4_config(attn_temperature_tuning=False, use_qk_norm=False))
    assert all(a.temperature is None and a.qk_norm_eps is None for a in _attention(off))


@pytest.mark.parametrize("rope_type", ["llama3", "default"])
def test_interleaved_rope_matches_transformers(rope_type: str) -> None:
    from transformers.models.llama4.modeling_llama4 import (
        Llama4TextRotaryEmbedding,
        apply_rotary_emb,
    )

    config = llama4_config()
    if rope_type == "default":
        config = llama4_config(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    positions = torch.arange(40)
    q, k = torch.randn(40, 4, 16), torch.randn(40, 2, 16)
    freqs = Llama4TextRotaryEmbedding(config)(q, positions[None])  # [1, 40, 8] complex
    want_q, want_k = apply_rotary_emb(q[None], k[None], freqs)
    rotary = InterleavedRotary(16, rope_parameters(config))
    cos, sin = rotary.cos_sin(positions)
    torch.testing.assert_close(InterleavedRotary.rotate(q, cos, sin), want_q[0])
    torch.testing.assert_close(InterleavedRotary.rotate(k, cos, sin), want_k[0])


def test_moe_matches_transformers_with_two_picks() -> None:
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    config = llama4_config(num_local_experts=3, num_experts_per_tok=2)
    torch.manual_seed(0)
    ref = Llama4TextMoe(config)
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ours = Llama4MoE(config)
    ours.load_state_dict(ref.state_dict())  # same names and layout as the checkpoint
    x = torch.randn(37, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x)[0], rtol=1e-5, atol=1e-5)
        picked, _ = ours.route(x)
    assert len(set(picked.flatten().tolist())) == 3  # every expert got tokens


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_hidden_layers": 8, "no_rope_layers": None, "interleave_moe_layer_step": 1},
        {"attention_chunk_size": None},
    ],
)
def test_chunked_layers_agree_with_the_planned_layout(overrides: dict[str, Any]) -> None:
    config = llama4_config(**overrides)
    kinds = read_llama4_text(config)
    with torch.device("meta"):
        model = Llama4ForCausalLM(config)
    for kind, attn in zip(kinds, _attention(model), strict=True):
        chunk = attn.attn.options.chunk_size
        if isinstance(kind, ChunkedLocalLayer):
            assert chunk == kind.attention_chunk_size
        else:
            assert isinstance(kind, FullAttentionLayer) and chunk is None
    if overrides.get("no_rope_layers", 0) is None:  # the default: NoPE every 4th layer
        assert [isinstance(k, FullAttentionLayer) for k in kinds] == [False, False, False, True] * 2


def test_checkpoint_names_of_both_architectures() -> None:
    with torch.device("meta"):
        model = Llama4ForCausalLM(llama4_config())
    t = torch.zeros(1)
    experts = "model.layers.1.feed_forward.experts.gate_up_proj"
    assert model.checkpoint_tensors(experts, t) == [(experts, t)]
    assert model.checkpoint_tensors(f"language_model.{experts}", t) == [(experts, t)]
    assert model.checkpoint_tensors("language_model.lm_head.weight", t) == [("lm_head.weight", t)]
    assert model.checkpoint_tensors("vision_model.class_embedding", t) == []  # IGNORED
    assert model.checkpoint_tensors("multi_modal_projector.linear_1.weight", t) == []  # IGNORED
    with pytest.raises(ValueError, match="per-expert"):  # a CheckpointError
        model.checkpoint_tensors("model.layers.1.feed_forward.experts.0.gate_proj.weight", t)
    with torch.device("meta"):
        tied = Llama4ForCausalLM(llama4_config(tie_word_embeddings=True))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert tied.checkpoint_tensors("lm_head.weight", t) == []  # IGNORED
