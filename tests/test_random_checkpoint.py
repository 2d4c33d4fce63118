"""``benchmarks/random_checkpoint.py``: a real model's shape with random weights.

The engine benchmarks run on it where the real weights cannot be carried (a GPU
lease), so it must have the real model's shape (the layout our planner derives
from it is the shipped one) and load in both engines, which must agree on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from random_checkpoint import MARKER, SHAPES, write_random_checkpoint  # noqa: E402

from hybridkv.engine import LLM, SamplingParams  # noqa: E402
from hybridkv.layouts import layout_from_hf_config, shipped_layout  # noqa: E402

#: Gemma 3 270M shrunk to run in a second on the CPU (the same kinds of layers).
SMALL = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": 8,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
}


def test_the_270m_shape_is_the_shipped_layout(tmp_path: Path) -> None:
    (tmp_path / "gemma-3-270m").mkdir()
    (tmp_path / "gemma-3-270m" / "config.json").write_text(json.dumps(SHAPES["gemma-3-270m"]))
    imported = layout_from_hf_config(tmp_path / "gemma-3-270m")
    assert imported.resolved_layers == shipped_layout("gemma-3-270m").resolved_layers


def test_a_small_random_checkpoint_runs_in_both_engines_alike(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = write_random_checkpoint("gemma-3-270m", tmp_path / "ckpt", seed=3, overrides=SMALL)
    assert json.loads((path / MARKER).read_text()) == {
        "shape": "gemma-3-270m",
        "seed": 3,
        "overrides": SMALL,
    }
    prompt = list(range(5, 25))
    llm = LLM(path, dtype=torch.float32, device="cpu", block_size=4, kernel_backend="torch")
    assert llm.tokenizer is None  # no tokenizer files: prompts are ids
    ours = (
        llm.generate(
            {"prompt_token_ids": prompt},
            SamplingParams(max_tokens=6, ignore_eos=True),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6, do_sample=False
        )[0, len(prompt) :].tolist()
    assert ours == want
    # Weights are drawn, not zero: a random model's logits differ across tokens.
    assert hf.model.embed_tokens.weight.float().std() > 0.01


def test_made_once_and_never_over_a_foreign_folder(tmp_path: Path) -> None:
    path = write_random_checkpoint("gemma-3-270m", tmp_path / "a", overrides=SMALL)
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    assert write_random_checkpoint("gemma-3-270m", path, overrides=SMALL) == path
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before
    with pytest.raises(FileExistsError, match="holds no random checkpoint"):
        write_random_checkpoint("gemma-3-270m", path, seed=1, overrides=SMALL)
    with pytest.raises(KeyError, match="known: gemma-3-270m"):
        write_random_checkpoint("gemma-3-9000b", tmp_path / "b")
