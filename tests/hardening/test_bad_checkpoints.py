"""Broken checkpoints: one line naming the file and the problem, exit 2; a ``ValueError``.

Each case breaks a copy of the tiny checkpoint the way a user's download or
edit might, then checks ``hybridkv generate`` (the exact stderr line, status
2, no traceback) and ``LLM(...)`` (a ``ValueError`` with the same message).
Weights are never loaded for these: ``load_model`` is made to fail loudly, so
a check that came only after loading would be caught.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridkv.engine import LLM
from hybridkv.models.loader import CheckpointError

Copy = Callable[[str], Path]
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def no_weight_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were loaded before the checkpoint was checked")

    monkeypatch.setattr("hybridkv.engine.llm.load_model", refuse)


def header_length(path: Path) -> int:
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return int(n)


def expect_refused(cli: Cli, model: Path, message: str) -> None:
    """The CLI prints exactly ``message`` as its one error line; the API raises it."""
    rc, out, err = cli("generate", str(model), "--prompt", "w5 w6", "--max-tokens", "2")
    assert (rc, out) == (2, "")
    assert err.splitlines() == [f"hybridkv generate: error: {message}"]
    with pytest.raises(ValueError) as info:
        LLM(model)
    assert str(info.value) == message


def test_safetensors_cut_short(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("cut")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    n = header_length(weights)
    need = len(data) - 8 - n
    weights.write_bytes(data[: len(data) // 2])
    held = len(data) // 2 - 8 - n
    expect_refused(
        cli,
        model,
        f"{weights}: the file is cut short: its header lists {need:,} "
        f"bytes of tensor data, the file holds {held:,}",
    )
    with pytest.raises(CheckpointError):  # a ValueError subclass names the class of problem
        LLM(model)


def test_safetensors_header_only(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("header")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    n = header_length(weights)
    weights.write_bytes(data[: 8 + n])
    expect_refused(
        cli,
        model,
        f"{weights}: the file holds only its header, none of the "
        f"{len(data) - 8 - n:,} bytes of tensor data it lists (cut short?)",
    )


def test_safetensors_empty(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("empty")
    weights = model / "model.safetensors"
    weights.write_bytes(b"")
    expect_refused(cli, model, f"{weights}: the file is empty (0 bytes), not safetensors")


def test_safetensors_cut_inside_the_header(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("inheader")
    weights = model / "model.safetensors"
    n = header_length(weights)
    weights.write_bytes(weights.read_bytes()[:100])
    expect_refused(
        cli,
        model,
        f"{weights}: the file is cut short inside its header (100 bytes; "
        f"the header alone needs {8 + n:,})",
    )


def test_config_not_json(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("badjson")
    config = model / "config.json"
    config.write_text('{"model_type": "gemma3_text", ')
    expect_refused(
        cli,
        model,
        f"{config}: not a readable JSON config (Expecting property name "
        "enclosed in double quotes: line 1 column 31 (char 30))",
    )


def wrongly_typed(copy: Copy) -> Path:
    model = copy("typed")
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = "many"
    (model / "config.json").write_text(json.dumps(config))
    return model


TYPED_MESSAGE = (
    "{config}: transformers cannot read this config (Validation error for field "
    "'num_hidden_layers': TypeError: Field 'num_hidden_layers' expected int, got "
    "str (value: 'many'))"
)


def test_config_with_a_wrongly_typed_field(ckpt_copy: Copy, cli: Cli) -> None:
    model = wrongly_typed(ckpt_copy)
    expect_refused(cli, model, TYPED_MESSAGE.format(config=model / "config.json"))


def test_plan_on_a_wrongly_typed_config(ckpt_copy: Copy, cli: Cli) -> None:
    model = wrongly_typed(ckpt_copy)
    rc, out, err = cli("plan", str(model), "--memory", "1GiB")
    assert (rc, out) == (2, "")
    message = TYPED_MESSAGE.format(config=model / "config.json")
    assert err.splitlines() == [f"hybridkv plan: error: {message}"]


def test_garbage_tokenizer_names_the_file(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("tok")
    (model / "tokenizer.json").write_text("garbage{{{")
    expect_refused(
        cli,
        model,
        f"{model / 'tokenizer.json'}: not a valid tokenizer file "
        "(Expecting value: line 1 column 1 (char 0))",
    )


def test_bad_chat_template_in_the_checkpoint(ckpt_copy: Copy, cli: Cli) -> None:
    model = ckpt_copy("tmpl")
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }")
    expect_refused(
        cli,
        model,
        f"{model / 'chat_template.jinja'} (chat template 'default'): "
        "not a valid Jinja template (line 1: unexpected '}')",
    )


def test_gguf_magic_then_garbage(tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    monkeypatch.setenv("HYBRIDKV_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    body = b"garbage" * 20
    model.write_bytes(b"GGUF" + struct.pack("<I", 3) + body)
    tensors, meta = struct.unpack("<QQ", body[:16])
    message = (
        f"{model}: corrupt or truncated GGUF: its header lists {tensors:,} tensors and "
        f"{meta:,} metadata entries, more than its {8 + len(body)} bytes can hold"
    )
    expect_refused(cli, model, message)


def test_unknown_kernel_backend_from_the_environment(
    tiny_ckpt: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYBRIDKV_KERNEL_BACKEND", "bogus")
    expect_refused(
        cli,
        tiny_ckpt,
        "HYBRIDKV_KERNEL_BACKEND='bogus': unknown backend; choose "
        "one of ('triton', 'torch', 'native', 'mamba_ssm')",
    )
