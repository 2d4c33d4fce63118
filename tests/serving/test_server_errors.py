"""OpenAI error JSON for bad calls (400, 404), a full queue (503) and ``hybridkv serve``'s CLI."""

from __future__ import annotations

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
        ({"prompt": "w5", "n": 2}, 400, "n=2"),
        ({"prompt": "w5", "logprobs": 2}, 400, "logprobs"),
        ({"prompt": "w5", "echo": True}, 400, "echo"),
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
    release = threading.Event()
    try:
        # Hold the engine thread inside a call: submitted requests stay queued.
        engine.call(lambda llm: release.wait(30))
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


def test_cli_bad_options_are_one_line_exit_2(tok_ckpt: Path, capsys: Any) -> None:
    assert main(["serve", str(tok_ckpt), "--max-waiting", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hybridkv serve: error: --max-waiting must be >= 1, got 0"
    assert main(["serve", str(tok_ckpt), "--chat-template", "/nonexistent/t.jinja"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hybridkv serve: error: --chat-template /nonexistent/t.jinja: No such file or directory"
    )
    assert main(["serve", str(tok_ckpt / "missing")]) == 2
    assert capsys.readouterr().err.startswith("hybridkv serve: error: ")
    assert main(["serve", str(tok_ckpt), "--hybrid-return-bonus", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hybridkv serve: error: hybrid_return_bonus tunes cache_policy='hybrid'; "
        "it changes nothing under 'lru'"
    )
    argv = ["serve", str(tok_ckpt), "--cache-policy", "hybrid", "--hybrid-value-weight", "-2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "hybridkv serve: error: hybrid_value_weight must be a finite number >= 0, got -2.0"
    )
    argv = ["serve", str(tok_ckpt), "--cache-policy", "hybrid", "--hybrid-return-grade", "x"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hybridkv serve: error: hybrid_return_grade must be one of flat, turn, log-turn, got 'x'"
    )
    argv = ["serve", str(tok_ckpt), "--cache-policy", "hybrid", "--hybrid-floor-tokens", "-1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hybridkv serve: error: hybrid_floor_tokens must be None (by cost) or an int >= 0, got -1"
    )
    argv = ["serve", str(tok_ckpt), "--cache-policy", "hybrid", "--hybrid-tuning", "floor_rate=8"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("hybridkv serve: error: unknown tuning floor_rate;")
    argv = ["serve", str(tok_ckpt), "--hybrid-tuning", "floor_ratio=8"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hybridkv serve: error: hybrid_tuning tunes cache_policy='hybrid'; "
        "it changes nothing under 'lru'"
    )
    if not torch.cuda.is_available():
        assert main(["serve", str(tok_ckpt), "--device", "cpu", "--cuda-graphs"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            "hybridkv serve: error: cuda_graphs=True: CUDA graphs need a CUDA device, not 'cpu'"
        )


def test_cli_bad_chat_template_is_one_line(tok_ckpt: Path, tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }")
    assert main(["serve", str(tok_ckpt), "--chat-template", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hybridkv serve: error: --chat-template {bad}: not a valid Jinja")
    assert "\n" not in err
