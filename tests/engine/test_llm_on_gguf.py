"""``LLM`` on a ``.gguf`` file: converted once to a cached checkpoint, then generates like it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gguf import write_tiny_gguf
from tiny_checkpoints import converts_gguf_tokenizer

from hybridkv.engine import LLM, SamplingParams


@converts_gguf_tokenizer
def test_llm_loads_a_gguf_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDKV_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "tiny.gguf"
    model = write_tiny_gguf(src, tied=True)
    prompt = [2, 13, 47, 54, 8, 56, 5, 9, 47, 55, 30, 12]
    llm = LLM(src, block_size=4)
    assert llm.model_dir.parent == tmp_path / "cache" / "gguf"
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    ours = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert ours[0].outputs[0].token_ids == ref[0, len(prompt) :].tolist()
    assert LLM(src, block_size=4).model_dir == llm.model_dir  # converted once, reused
