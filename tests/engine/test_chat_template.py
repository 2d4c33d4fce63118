"""Which template renders a chat when the caller names none (``hybridkv.engine.chat_template``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.chat_template import default_chat_template, transcript_template
from hybridkv.engine.tokenizer import load_tokenizer
from hybridkv.models.demo_checkpoint import DEMO_GGUF, DEMO_NAME, is_demo_checkpoint
from hybridkv.models.gguf import MARKER_NAME

CONV = [
    {"role": "system", "content": "w9"},
    {"role": "user", "content": "w5 w6"},
    {"role": "assistant", "content": "w7"},
    {"role": "user", "content": "w8"},
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 with a word tokenizer that has no chat template."""
    path = tmp_path_factory.mktemp("cache") / DEMO_NAME
    save_word_tokenizer(save_checkpoint(gemma3_config(), path))
    (path / "chat_template.jinja").unlink()
    return path


def _mark(path: Path, source: str | None) -> None:
    if source is None:
        (path / MARKER_NAME).unlink(missing_ok=True)
    else:
        (path / MARKER_NAME).write_text(json.dumps({"format": 1, "source": source}))


def test_the_transcript_renders_each_role_on_its_line(ckpt: Path) -> None:
    tok = load_tokenizer(ckpt)
    text = tok.apply_chat_template(
        CONV, chat_template=transcript_template(), tokenize=False, add_generation_prompt=True
    )
    assert text == "<bos>System: w9\nUser: w5 w6\nAssistant: w7\nUser: w8\nAssistant:"
    # The demo's two roles render as the demo's template always did.
    assert tok.apply_chat_template(
        CONV[1:3], chat_template=transcript_template(), tokenize=False
    ) == ("<bos>User: w5 w6\nAssistant: w7\n")


def test_the_demo_checkpoint_is_known_by_its_conversion_marker(ckpt: Path) -> None:
    tok = load_tokenizer(ckpt)
    _mark(ckpt, None)
    assert not is_demo_checkpoint(ckpt) and default_chat_template(tok, ckpt) is None
    _mark(ckpt, "other.gguf")
    assert not is_demo_checkpoint(ckpt) and default_chat_template(tok, ckpt) is None
    (ckpt / MARKER_NAME).write_text("not json")
    assert not is_demo_checkpoint(ckpt)
    _mark(ckpt, DEMO_GGUF)
    got = default_chat_template(tok, ckpt)
    assert got is not None and is_demo_checkpoint(ckpt)
    assert got.text == transcript_template() and got.stop == ("\n",)
    assert "demo's plain transcript" in got.source


def test_the_checkpoints_own_template_wins(tmp_path: Path) -> None:
    path = save_word_tokenizer(save_checkpoint(gemma3_config(), tmp_path / DEMO_NAME))
    _mark(path, DEMO_GGUF)  # even on the demo checkpoint
    got = default_chat_template(load_tokenizer(path), path)
    assert got is not None and got.text is None and got.stop == ()


def test_transformers_default_where_the_tokenizer_has_one(ckpt: Path) -> None:
    class Tok:  # what transformers 4 (< 4.43) tokenizers had
        chat_template = None
        default_chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

    _mark(ckpt, None)
    got = default_chat_template(Tok(), ckpt)
    assert got is not None and got.text == Tok.default_chat_template
    assert got.source == "transformers' default for Tok"
    Tok.default_chat_template = ""
    assert default_chat_template(Tok(), ckpt) is None
    assert default_chat_template(None, ckpt) is None


def test_llm_chat_on_the_demo_checkpoint_uses_the_transcript(ckpt: Path) -> None:
    _mark(ckpt, None)
    plain = LLM(ckpt, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match=r"has none \(nor is there a default for it\); pass"):
        plain.chat([{"role": "user", "content": "w5"}], use_tqdm=False)
    _mark(ckpt, DEMO_GGUF)
    llm = LLM(ckpt, block_size=4, max_model_len=64)
    params = SamplingParams(max_tokens=3)
    out = llm.chat([{"role": "user", "content": "w5 w6"}], params, use_tqdm=False)[0]
    want = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "w5 w6"}],
        chat_template=transcript_template(),
        add_generation_prompt=True,
        tokenize=True,
    )
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert out.prompt_token_ids == list(want)
    assert len(out.outputs[0].token_ids) == 3
