"""The command line as users try it: ``--plot`` paths, ``--version``, ``python -m``,
``--chat`` without a template, long ``--max-model-len``.

Errors are one exact ``hybridkv COMMAND: error: ...`` line with status 2.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridkv import __version__

Cli = Callable[..., tuple[int, str, str]]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plan(cli: Cli, *extra: str) -> tuple[int, str, str]:
    return cli("plan", "gemma-3-270m", "--memory", "1GiB", *extra)


# -- --plot ---------------------------------------------------------------------------------
def test_plot_without_a_suffix_writes_exactly_there(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "figure"
    rc, out, err = plan(cli, "--plot", str(target))
    assert rc == 0 and err == ""
    assert out.splitlines()[-1] == f"figure written to {target}"
    assert target.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure"]  # no figure.png beside it


def test_plot_suffix_picks_the_format(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "figure.svg"
    assert plan(cli, "--plot", str(target))[0] == 0
    assert b"<svg" in target.read_bytes()[:500]


def test_plot_into_a_directory_is_refused(cli: Cli, tmp_path: Path) -> None:
    rc, out, err = plan(cli, "--plot", str(tmp_path))
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        f"hybridkv plan: error: --plot {tmp_path}: is a directory; give "
        f"a file path such as {tmp_path}/plan.png"
    ]
    assert list(tmp_path.iterdir()) == []


def test_plot_with_an_unknown_suffix_is_refused(cli: Cli, tmp_path: Path) -> None:
    rc, _, err = plan(cli, "--plot", str(tmp_path / "x.jpeg2"))
    assert rc == 2
    assert err.splitlines() == [
        f"hybridkv plan: error: --plot {tmp_path / 'x.jpeg2'}: unknown "
        "file type '.jpeg2'; use .png, .svg or .pdf (no suffix writes a "
        "PNG)"
    ]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_plot_to_a_full_device_fails_in_a_line(cli: Cli) -> None:
    pytest.importorskip("matplotlib")
    rc, out, err = plan(cli, "--plot", "/dev/full")
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        "hybridkv plan: error: cannot write the figure to /dev/full: No space left on device"
    ]
    assert not Path("/dev/full.png").exists()


# -- entry points ---------------------------------------------------------------------------
def test_version(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli("--version")
    assert info.value.code == 0
    assert capsys.readouterr().out == f"hybridkv {__version__}\n"


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hybridkv", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, f"hybridkv {__version__}\n")


# -- generate -------------------------------------------------------------------------------
def test_chat_without_a_template_names_an_option_that_exists(
    ckpt_copy: Callable[[str], Path], cli: Cli, tmp_path: Path
) -> None:
    model = ckpt_copy("no_template")
    (model / "chat_template.jinja").unlink()
    args = ("generate", str(model), "--prompt", "w5 w6", "--max-tokens", "2", "--chat")
    rc, out, err = cli(*args)
    assert (rc, out) == (2, "")
    # Found on the tokenizer, before the weights load: the error is the only line.
    assert "Traceback" not in err and err.count("error:") == 1
    assert err.strip() == (
        "hybridkv generate: error: chat needs a chat template, and this checkpoint's tokenizer "
        "has none (nor is there a default for it); pass one: "
        "hybridkv generate MODEL --chat --chat-template FILE"
    )
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    rc, out, _ = cli(*args, "--chat-template", str(template))
    assert rc == 0 and out.strip()  # the option named exists and works


def test_bad_chat_template_file(tiny_ckpt: Path, cli: Cli, tmp_path: Path) -> None:
    template = tmp_path / "bad.jinja"
    template.write_text("{% if %}")
    rc, _, err = cli(
        "generate", str(tiny_ckpt), "--prompt", "w5", "--chat", "--chat-template", str(template)
    )
    assert rc == 2
    assert err.splitlines() == [
        f"hybridkv generate: error: --chat-template {template}: not a "
        "valid Jinja template (line 1: Expected an expression, got 'end "
        "of statement block')"
    ]


def test_generate_max_model_len_beyond_the_model(tiny_ckpt: Path, cli: Cli) -> None:
    args = ("generate", str(tiny_ckpt), "--prompt", "w5", "--max-model-len", "100000")
    head = (
        f"hybridkv generate: error: max_model_len=100000 exceeds {tiny_ckpt}'s 1024 "
        "positions (max_position_embeddings): generation past them is silently wrong"
    )
    rc, _, err = cli(*args)
    assert rc == 2 and err.splitlines() == [f"{head}; lower max_model_len"]
    rc, _, err = cli(*args, "--allow-long-max-model-len")  # no RoPE scaling: no override
    assert rc == 2 and err.splitlines() == [
        f"{head}, and the model has no RoPE scaling, so the override "
        "allow_long_max_model_len=True (--allow-long-max-model-len) does not apply; lower "
        "max_model_len"
    ]


def test_plan_max_model_len_beyond_the_layout(cli: Cli) -> None:
    rc, out, err = plan(cli, "--max-model-len", "1000000")
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        "hybridkv plan: error: max_model_len=1000000 exceeds gemma-3-270m's 32768 positions "
        "(the layout's max_model_len): generation past them is silently wrong; lower "
        "max_model_len"
    ]
    assert plan(cli, "--max-model-len", "32768")[0] == 0
