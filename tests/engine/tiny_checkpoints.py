"""Tiny random Hugging Face checkpoints of each family, saved like real ones.

Windows and chunks are smaller than the test prompts and not multiples of the
engine's block size (4 in the tests). ``initializer_range`` is raised so that
logits are spread out and greedy choices are not near-ties. Random models get
``generation_config.eos_token_id = None`` so they always produce the asked
number of tokens.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_configs import TINY_JAMBA_LAYERS

COMMON: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    initializer_range=0.2,
)
WINDOW = 7


def gemma3_config(**overrides: Any) -> Any:
    from transformers import Gemma3TextConfig

    kw = dict(
        COMMON,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        query_pre_attn_scalar=16,
        initializer_range=0.02,
    )
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


#: model_type -> transformers' gated RMSNorm class of its Mamba2 mixer (module, class).
_GATED_NORMS = {
    "bamba": ("transformers.models.bamba.modeling_bamba", "BambaRMSNormGated"),
    "granitemoehybrid": (
        "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
        "GraniteMoeHybridRMSNormGated",
    ),
}


def hf_reference_problem(path: Path) -> str:
    """Why transformers is no reference for the checkpoint at ``path`` ('' when it is).

    Bamba's and Granite 4.0 H's Mamba2 mixer ends in a gated RMSNorm that normalizes each
    of the ``mamba_n_groups`` groups of channels by its own RMS: mamba-ssm's
    ``RMSNormGated(group_size=d_inner // ngroups)``, transformers from 5.23.0 (its
    ``*RMSNormGated`` takes ``group_size``) and our ``GatedRMSNorm``. transformers 5.22.2
    and before normalize all ``d_inner`` channels at once: the same at one group (the
    real Bamba 9B and Granite 4.0 H checkpoints), not at two (the tiny ones here; on
    the 2026-11-27 H100 lease, transformers 5.17's logits were 1.8 off ours at the first
    step, on the GPU and on the CPU alike).
    """
    config = json.loads((path / "config.json").read_text())
    groups = config.get("mamba_n_groups") or 1
    norm = _GATED_NORMS.get(config.get("model_type", ""))
    if groups == 1 or norm is None:
        return ""
    cls = getattr(importlib.import_module(norm[0]), norm[1])
    if "group_size" in inspect.signature(cls.__init__).parameters:
        return ""
    import transformers

    return (
        f"transformers {transformers.__version__}'s {norm[1]} normalizes all "
        f"{groups} groups of channels at once (per group from transformers 5.23.0, "
        "as mamba-ssm and this engine do): no reference for a checkpoint of "
        f"mamba_n_groups {groups}"
    )


def skip_unless_hf_is_a_reference(path: Path) -> None:
    """``pytest.skip`` the calling test when ``hf_reference_problem(path)`` names one."""
    problem = hf_reference_problem(path)
    if problem:
        pytest.skip(problem)


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of ``prompt`` and its per-step logits ``[n, V]``.

    transformers runs in float64 (MoE experts in its eager loop, the only one that takes
    float64), so the reference carries no rounding of its own: the float32 rounding of
    both sides can add up at a sensitive step (1.9e-4 between transformers' float32 and
    ours on an AVX2 box, Jamba, each within 1e-4 of float64). Logits come back as float32.
    Skips the calling test where this transformers is no reference for the checkpoint
    (``hf_reference_problem``).
    """
    from transformers import AutoModelForCausalLM

    skip_unless_hf_is_a_reference(path)

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float64, experts_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, torch.cat(out.logits).float()


def jamba_config(**overrides: Any) -> Any:
    """Jamba: Mamba1 on layers 0 and 2, full attention on 1 and 3, MoE (2 experts) on 1 and 3."""
    from transformers import JambaConfig

    kw = dict(
        COMMON,
        num_hidden_layers=4,
        **TINY_JAMBA_LAYERS,
    )
    kw.update(overrides)
    return JambaConfig(**kw)


def bamba_config(**overrides: Any) -> Any:
    """Bamba: Mamba2 (8 heads of 16, 2 groups, d_state 16) on layers 0 and 2, full
    attention with RoPE on half of each head on 1 and 3."""
    from transformers import BambaConfig

    kw = dict(
        COMMON,
        num_hidden_layers=4,
        attn_layer_indices=[1, 3],
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=16,
    )
    kw.update(overrides)
    return BambaConfig(**kw)


def granite_config(**overrides: Any) -> Any:
    """Granite 4.0 H: Mamba2 (as ``bamba_config``) on layers 0 and 2, NoPE attention on 1
    and 3, 4 experts (top 2) plus the shared MLP everywhere, and multipliers away from 1."""
    from transformers import GraniteMoeHybridConfig

    kw = dict(
        COMMON,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        intermediate_size=32,
        shared_intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=16,
        position_embedding_type="nope",  # what Granite 4.0 H's checkpoints say
        embedding_multiplier=3.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=2.0,
    )
    kw.update(overrides)
    return GraniteMoeHybridConfig(**kw)


def mistral_config(**overrides: Any) -> Any:
    """Mistral: 3 layers, every one sliding over the last ``WINDOW`` tokens."""
    from transformers import MistralConfig

    kw = dict(COMMON, num_hidden_layers=3, head_dim=16, sliding_window=WINDOW)
    kw.update(overrides)
    return MistralConfig(**kw)


def ministral_config(**overrides: Any) -> Any:
    """Ministral: sliding layers 0 and 2 (``WINDOW`` tokens), full attention on 1 and 3."""
    from transformers import MinistralConfig

    kw = dict(
        COMMON,
        num_hidden_layers=4,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    kw.update(overrides)
    return MinistralConfig(**kw)


def cohere2_config(**overrides: Any) -> Any:
    """Cohere 2: sliding layers 0-2 (``WINDOW`` tokens, RoPE), a full NoPE layer 3, a
    logit scale away from 1 and tied embeddings (the family's default)."""
    from transformers import Cohere2Config

    kw = dict(
        COMMON,
        num_hidden_layers=4,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        logit_scale=0.5,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    kw.update(overrides)
    return Cohere2Config(**kw)


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)


def save_word_tokenizer(path: Path, vocab_size: int = 512) -> Path:
    """A whitespace word-level tokenizer (``w5`` ... ``w{V-1}``) with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "user": 3, "assistant": 4}
    vocab.update({f"w{i}": i for i in range(5, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return path


CHUNK = 6


def llama4_config(**overrides: Any) -> Any:
    """Llama 4 text: chunk 6 on three RoPE layers, one NoPE full layer, MoE every 2nd layer.

    ``floor_scale=4`` makes the NoPE layer's query temperature change every 4
    positions (the real default, 8192, would never trigger at test lengths).
    Llama 3 rope scaling with ``original_max_position_embeddings=32`` leaves
    one frequency as is, smooths one and divides the others by the factor.
    """
    from transformers import Llama4TextConfig

    rope = dict(
        rope_type="llama3",
        rope_theta=10000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=32,
    )
    kw = dict(
        COMMON,
        head_dim=16,
        num_hidden_layers=4,
        intermediate_size_mlp=128,
        attention_chunk_size=CHUNK,
        num_local_experts=2,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        no_rope_layers=[1, 1, 1, 0],
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.5,
        rope_parameters=rope,
    )
    kw.update(overrides)
    return Llama4TextConfig(**kw)


def gguf_tokenizer_refused() -> bool:
    """True where ``convert_gguf`` refuses to convert a GGUF's tokenizer (transformers
    before ``TOKENIZER_CHECKED_SINCE``: 5.17, the GPU machines' version)."""
    import transformers
    from packaging.version import Version

    from hybridkv.models.gguf import TOKENIZER_CHECKED_SINCE

    return Version(transformers.__version__) < Version(TOKENIZER_CHECKED_SINCE)


#: Marks a test that converts a GGUF with its own tokenizer.
converts_gguf_tokenizer = pytest.mark.skipif(
    gguf_tokenizer_refused(),
    reason="this transformers converts GGUF tokenizers wrongly: convert_gguf refuses "
    "(test_gguf.py::test_old_transformers_need_a_tokenizer_dir)",
)


#: Every engine family's tiny config, by name (the cross-family tests run them all).
FAMILY_CONFIGS = {
    "gemma3": gemma3_config,
    "llama4": llama4_config,
    "jamba": jamba_config,
    "bamba": bamba_config,
    "granite": granite_config,
    "ministral": ministral_config,
    "cohere2": cohere2_config,
}
