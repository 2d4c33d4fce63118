"""Shared pieces of the hardening tests: a tiny checkpoint, broken copies of it, the CLI.

The checkpoint is the engine tests' tiny Gemma 3 (``tests/engine/tiny_checkpoints.py``:
4 layers, 1,024 positions, a word-level tokenizer with a chat template), saved once
per session; each test breaks its own copy.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from engine.tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

from hybridkv.cli import main


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("hardening_ckpt"))
    return save_word_tokenizer(path)


@pytest.fixture
def ckpt_copy(tiny_ckpt: Path, tmp_path: Path) -> Callable[[str], Path]:
    """``copy(name)``: a fresh copy of the tiny checkpoint at ``tmp_path / name``."""

    def copy(name: str) -> Path:
        return Path(shutil.copytree(tiny_ckpt, tmp_path / name))

    return copy


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``cli(*argv)``: ``hybridkv`` run in-process: ``(exit status, stdout, stderr)``."""

    def run(*argv: str) -> tuple[int, str, str]:
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return run
