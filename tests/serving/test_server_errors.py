"""OpenAI error JSON for bad calls (400, 404), a full queue (503) and ``hybridkv serve``'s CLI."""

from __future__ import annotations

import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from live_server import start_server
from serve_http import post, wait_until

from hybridkv.cli import main


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"prompt": "w5", "temperature": -1}, 400, "temperature"),
        ({"prompt": "w5", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "w5", "n": 0}, 400, "n"),
        ({"prompt": "w5", "logprobs": 21}, 400, "logprobs must be at most 20"),
        ({"prompt": "w5", "echo": True, "logprobs": 1}, 400, "echo with logprobs"),
        ({"prompt": "w5", "suffix": "w6"}, 400, "suffix is not supported"),
        ({"prompt": " ".join(["w5"] * 65)}, 400, "more than max_model_len=64"),
        ({"prompt": [5, 600]}, 400, "token ids must be ints in [0, 512)"),
        ({"prompt": ""}, 400, "empty"),
        ({}, 400, "prompt"),
        ({"prompt": "w5", "model": "gpt-4"}, 404, "`gpt-4` does not exist"),
    ],
)
def test_bad_completion_calls(server: Any, body: dict[str, Any], status: int, says: str) -> None:
    live, engine = server
    code, _, out = post(live.url, "/v1/completions", dict({"model": "tiny"}, **body))
    assert code == status
    err = out["error"]
    assert says in err["message"]
    assert err["code"] == status and err["type"] in ("BadRequestError", "NotFoundError")
    # Nothing reached the engine.
    engine.call(lambda llm: llm.manager.check_integrity()).result(30)


def test_bad_chat_calls(server: Any) -> None:
    live, _ = server
    code, _, out = post(live.url, "/v1/chat/completions", {"model": "tiny", "messages": []})
    assert code == 400 and "messages" in out["error"]["message"]
    bad_part = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    code, _, out = post(live.url, "/v1/chat/completions", {"messages": bad_part})
    assert code == 400 and "only text parts" in out["error"]["message"]
    code, _, out = post(
        live.url, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}
    )
    assert code == 400 and "role" in out["error"]["message"]


def test_full_queue_is_503_with_retry_after(tok_ckpt: Path) -> None:
    live, engine = start_server(tok_ckpt, max_waiting=1)
    release, held = threading.Event(), threading.Event()

    def hold(_: Any) -> bool:
        held.set()
        return release.wait(60)

    try:
        # Hold the engine thread inside a call: submitted requests stay queued. Post
        # only once it is inside (else one turn can take the request and the call).
        engine.call(hold)
        assert held.wait(30), "the engine thread did not take the call"
        results: list[int] = []
        first = threading.Thread(
            target=lambda: results.append(
                post(live.url, "/v1/completions", {"prompt": "w5 w6", "max_tokens": 2})[0]
            )
        )
        first.start()
        wait_until(lambda: engine.num_waiting == 1)
        code, headers, out = post(live.url, "/v1/completions", {"prompt": "w7", "max_tokens": 2})
        assert code == 503
        assert headers["retry-after"] == "1"
        assert out["error"]["code"] == 503 and "busy" in out["error"]["message"]
        release.set()
        first.join(60)
        assert results == [200]
    finally:
        release.set()
        live.stop()


HYBRID = ("--cache-policy", "hybrid")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--max-waiting", "0"), "--max-waiting must be >= 1, got 0"),
        (
            ("--chat-template", "/nonexistent/t.jinja"),
            "--chat-template /nonexistent/t.jinja: No such file or directory",
        ),
        (
            ("--hybrid-return-bonus", "4"),
            "hybrid_return_bonus tunes cache_policy='hybrid'; it changes nothing under 'lru'",
        ),
        (
            (*HYBRID, "--hybrid-value-weight", "-2"),
            "hybrid_value_weight must be a finite number >= 0, got -2.0",
        ),
        (
            (*HYBRID, "--hybrid-return-grade", "x"),
            "hybrid_return_grade must be one of flat, turn, log-turn, got 'x'",
        ),
        (
            (*HYBRID, "--hybrid-floor-tokens", "-1"),
            "hybrid_floor_tokens must be None (by cost) or an int >= 0, got -1",
        ),
        (
            ("--hybrid-tuning", "floor_ratio=8"),
            "hybrid_tuning tunes cache_policy='hybrid'; it changes nothing under 'lru'",
        ),
    ],
)
def test_cli_bad_options_are_one_line_exit_2(
    tok_ckpt: Path, capsys: Any, args: tuple[str, ...], says: str
) -> None:
    assert main(["serve", "--port=0", str(tok_ckpt), *args]) == 2
    assert capsys.readouterr().err == f"hybridkv serve: error: {says}\n"


def test_cli_unknown_tuning_is_one_line(tok_ckpt: Path, capsys: Any) -> None:
    argv = ["serve", "--port=0", str(tok_ckpt), *HYBRID, "--hybrid-tuning", "floor_rate=8"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("hybridkv serve: error: unknown tuning floor_rate;")


def test_cli_missing_checkpoint_and_cuda_graphs_on_cpu(tok_ckpt: Path, capsys: Any) -> None:
    assert main(["serve", "--port=0", str(tok_ckpt / "missing")]) == 2
    assert capsys.readouterr().err.startswith("hybridkv serve: error: ")
    if not torch.cuda.is_available():
        assert main(["serve", "--port=0", str(tok_ckpt), "--device", "cpu", "--cuda-graphs"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            "hybridkv serve: error: cuda_graphs=True: CUDA graphs need a CUDA device, not 'cpu'"
        )


def test_cli_bad_chat_template_is_one_line(tok_ckpt: Path, tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }")
    assert main(["serve", "--port=0", str(tok_ckpt), "--chat-template", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hybridkv serve: error: --chat-template {bad}: not a valid Jinja")
    assert "\n" not in err


def test_chat_without_a_template_names_the_serve_option(tok_ckpt: Path, tmp_path: Path) -> None:
    plain = tmp_path / "no_template"
    shutil.copytree(tok_ckpt, plain)
    (plain / "chat_template.jinja").unlink()
    live, _ = start_server(plain)
    chat = {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 2}
    try:
        code, _, out = post(live.url, "/v1/chat/completions", chat)
        assert code == 400 and out["error"]["param"] == "messages"
        assert out["error"]["message"] == (
            "chat needs a chat template, and this checkpoint's tokenizer has none (nor is there "
            "a default for it); start the server with hybridkv serve MODEL --chat-template FILE"
        )
        # A request's own fields are checked first: their errors are not hidden by this one.
        code, _, out = post(live.url, "/v1/chat/completions", dict(chat, model="gpt-4"))
        assert code == 404 and out["error"]["param"] == "model"
        code, _, out = post(live.url, "/v1/chat/completions", dict(chat, tools=[{"x": 1}]))
        assert code == 400 and "tools" in out["error"]["message"]
        assert post(live.url, "/v1/completions", {"prompt": "w5", "max_tokens": 2})[0] == 200
    finally:
        live.stop()


def test_a_port_in_use_is_found_before_the_weights_load(
    tok_ckpt: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridkv.engine import llm as llm_module

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(llm_module.LLM, "__init__", never)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        assert main(["serve", str(tok_ckpt), "--port", str(port)]) == 2
    finally:
        holder.close()
    assert capsys.readouterr().err == (
        f"hybridkv serve: error: --port {port}: 127.0.0.1:{port} is already in use; "
        "stop what holds it or pass another --port\n"
    )
    assert main(["serve", str(tok_ckpt), "--port", "70000"]) == 2
    assert capsys.readouterr().err == (
        "hybridkv serve: error: --port must be in [0, 65535], got 70000\n"
    )
