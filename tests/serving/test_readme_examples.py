"""Every code block of the README's serving section runs as written.

The section's blocks are read in order: a ``hybridkv serve ...`` line starts a
server with exactly those options (on the demo checkpoint's tiny stand-in, at
a free loopback port), each ``curl`` command runs in bash against it, and each
Python block runs in this process, ``export NAME=VALUE`` sets the variable for
what follows; ``http://127.0.0.1:8000`` is the only text changed (to the test
server's address). Every call must succeed: curl's output is an OpenAI
response (not an error object) and the Python blocks print text. A new
example in that section is run too; one this test cannot run fails it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from live_server import LiveServer

README = Path(__file__).resolve().parents[2] / "README.md"
DOCUMENTED_URL = "http://127.0.0.1:8000"
DEMO_PATH = "~/.cache/hybridkv/gemma-3-270m-q4_k_m"
#: What each ``curl`` answers (its ``object``), by the path it calls.
OBJECTS = {
    "/v1/chat/completions": "chat.completion",
    "/v1/completions": "text_completion",
    "/v1/models": "list",
}

pytest.importorskip("openai")


def serving_blocks() -> list[tuple[str, str]]:
    """``(language, code)`` of each fenced block in the README's serving section."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## Serving: `hybridkv serve`")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else None]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def commands(code: str) -> list[str]:
    """A bash block's commands, backslash continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.startswith("#")]


def start_documented_server(line: str, checkpoint: Path) -> tuple[LiveServer, Any]:
    from hybridkv.serving.command import add_serve_parser, build_server

    argv = shlex.split(os.path.expandvars(line))
    assert argv[:3] == ["hybridkv", "serve", DEMO_PATH], line  # the demo's checkpoint
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", str(checkpoint), *argv[3:]])
    app, engine = build_server(args)
    return LiveServer(app), engine


def run_curl(command: str, url: str) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    done = subprocess.run(
        ["bash", "-c", command.replace(DOCUMENTED_URL, url)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    path = next(p for p in OBJECTS if f"{DOCUMENTED_URL}{p}" in command)
    assert out.get("object") == OBJECTS[path], out
    if path != "/v1/models":
        assert out["choices"], out


def run_python(code: str, url: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace(DOCUMENTED_URL, url), str(README), "exec"), {})
    return printed.getvalue()


def test_every_serving_example_runs(
    demo_standin: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("HYBRIDKV_API_KEY", raising=False)  # the examples set it themselves
    blocks = serving_blocks()
    assert [lang for lang, _ in blocks].count("python") >= 1
    live: LiveServer | None = None
    ran = {"serve": 0, "curl": 0, "python": 0, "chat": 0}
    try:
        for lang, code in blocks:
            if lang == "python":
                assert live is not None, "a Python example before any hybridkv serve line"
                printed = run_python(code, live.url)
                assert printed.strip(), code
                ran["python"] += 1
                ran["chat"] += "chat.completions" in code
                continue
            assert lang == "bash", f"a {lang} block in the serving section: teach this test"
            for command in commands(code):
                if command.startswith("export "):
                    name, _, value = command.removeprefix("export ").partition("=")
                    monkeypatch.setenv(name, shlex.split(value)[0])
                elif command.startswith("hybridkv serve"):
                    if live is not None:
                        live.stop()
                    live, _ = start_documented_server(command, demo_standin)
                    ran["serve"] += 1
                    if os.environ.get("HYBRIDKV_API_KEY"):  # the key example: it is needed
                        with pytest.raises(urllib.error.HTTPError, match="401"):
                            urllib.request.urlopen(live.url + "/v1/models", timeout=30)
                elif command.startswith("curl"):
                    assert live is not None, "a curl example before any hybridkv serve line"
                    run_curl(command, live.url)
                    ran["curl"] += 1
                    ran["chat"] += "/chat/" in command
                else:
                    raise AssertionError(f"an example this test cannot run: {command}")
    finally:
        if live is not None:
            live.stop()
    # The demo checkpoint's chat works out of the box: the server said which template.
    assert "chat template: the demo's plain transcript" in capsys.readouterr().err
    assert ran["serve"] >= 2 and ran["curl"] >= 3 and ran["chat"] >= 3, ran
