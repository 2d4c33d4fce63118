"""Llama 4 on the engine vs transformers: same greedy tokens, logits within 1e-4 (fp32).

Tiny random checkpoint (``llama4_config``): chunked attention (chunk 6, block
size 4, so chunk boundaries fall inside blocks) with interleaved llama3-scaled
RoPE and L2 qk-norm on layers 0-2, a NoPE full-attention layer 3 whose query
temperature changes every 4 positions, MoE (2 experts + shared) on layers 1
and 3. Prompts are longer than the chunk; generation crosses more chunks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle import check_against_hf, run_engine
from safetensors import safe_open
from tiny_checkpoints import CHUNK, llama4_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.engine.outputs import RequestOutput
from hybridkv.models.loader import load_checkpoint

N = 12


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(llama4_config(), tmp_path_factory.mktemp("llama4"))


def _prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def _distinct(outs: list[RequestOutput]) -> None:
    assert all(len(set(o.outputs[0].token_ids)) >= 3 for o in outs)


def test_each_length_alone(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4)
    for n, seed in ((5, 1), (13, 2), (30, 3)):
        _distinct(check_against_hf(ckpt, llm, [_prompt(n, seed)], N))


@pytest.mark.parametrize("caching", [True, False])
def test_mixed_lengths_in_one_batch(ckpt: Path, caching: bool) -> None:
    llm = LLM(ckpt, block_size=4, enable_prefix_caching=caching)
    _distinct(check_against_hf(ckpt, llm, [_prompt(5, 1), _prompt(13, 2), _prompt(30, 3)], N))


def test_prefix_hit_matches(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4)
    doc = _prompt(26, 4)
    check_against_hf(ckpt, llm, [[*doc, 7, 8, 9]], N)
    outs = check_against_hf(ckpt, llm, [[*doc, 10, 11]], N)
    assert outs[0].num_cached_tokens == 24  # 6 full blocks of the shared 26 tokens
    _distinct(outs)


def test_small_budget_many_chunks(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4, max_num_batched_tokens=8)
    _distinct(check_against_hf(ckpt, llm, [_prompt(23, 5), _prompt(9, 6)], N))
    assert llm.num_steps >= 23 // 8 + N


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_by_a_tiny_cache(ckpt: Path, caching: bool) -> None:
    # 58 blocks of 1 KiB per layer; 4 requests of 40 tokens need 4 * 10 on the full layer.
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=48,
        enable_prefix_caching=caching,
        kv_cache_memory_bytes=60_000,
    )
    prompts = [_prompt(20, 10 + i) for i in range(4)]
    _distinct(check_against_hf(ckpt, llm, prompts, 20))
    assert llm.scheduler.num_preemptions > 0


def test_every_prefill_position_across_chunks_and_blocks(ckpt: Path) -> None:
    """Prompts ``p[:L]`` for every ``L`` <= 20 vs one HF forward over ``p``: position ``L - 1``
    sits at every offset inside its chunk (6) and its block (4), and the 5-token
    budget splits prefills at yet other offsets."""
    from transformers import AutoModelForCausalLM

    p = _prompt(20, 11)
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([p])).logits[0].float()  # [20, V]
    llm = LLM(ckpt, block_size=4, max_num_batched_tokens=5, enable_prefix_caching=False)
    outs, logits = run_engine(llm, [p[:n] for n in range(1, len(p) + 1)], 1)
    got = torch.cat(logits)  # [20, V], request L's row is position L - 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(p) > 3 * CHUNK
    assert [o.outputs[0].token_ids[0] for o in outs] == want.argmax(-1).tolist()


def test_multimodal_checkpoint_runs_its_text_model(ckpt: Path, tmp_path: Path) -> None:
    """A ``Llama4ForConditionalGeneration`` checkpoint: ``language_model.*`` renamed,
    the vision model and projector ignored; same logits as the text checkpoint."""
    from transformers import AutoModelForCausalLM, Llama4Config, Llama4ForConditionalGeneration

    text = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    vision = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=28,
        patch_size=14,
        projector_input_dim=64,
        projector_output_dim=64,
        vision_output_dim=64,
        pixel_shuffle_ratio=0.5,
    )
    config = Llama4Config(text_config=text.config.to_dict(), vision_config=vision)
    vlm = Llama4ForConditionalGeneration(config)
    vlm.language_model.load_state_dict(text.state_dict())
    vlm.save_pretrained(tmp_path)
    prompt = _prompt(14, 12)
    llm = LLM(tmp_path, block_size=4)
    _, ours = run_engine(llm, [prompt], N)
    _, want = run_engine(LLM(ckpt, block_size=4), [prompt], N)
    torch.testing.assert_close(ours[0], want[0], rtol=0, atol=0)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        skipped = [k for k in f.keys() if not k.startswith("language_model.")]  # noqa: SIM118
    # the loader fills the checkpoint's names: a model before the merge of its projections
    unmerged = LLM(tmp_path, block_size=4, merge_projections=False).model
    assert skipped and load_checkpoint(unmerged, tmp_path, torch.float32) == len(skipped)
