"""Fixtures: a tiny checkpoint with a tokenizer and a module-wide server on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import LiveServer, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")


@pytest.fixture(scope="session")
def tok_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

    path = save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("serve_gemma3"))
    return save_word_tokenizer(path)


@pytest.fixture(scope="session")
def demo_standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 that hybridkv takes for the demo checkpoint: the demo's folder name, a
    tokenizer without a chat template, and the marker ``demo_checkpoint()``'s conversion
    writes, naming the demo package's GGUF as its source."""
    from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

    from hybridkv.models.demo_checkpoint import DEMO_GGUF, DEMO_NAME
    from hybridkv.models.gguf import MARKER_NAME

    path = tmp_path_factory.mktemp("cache") / DEMO_NAME
    save_word_tokenizer(save_checkpoint(gemma3_config(max_position_embeddings=128), path))
    (path / "chat_template.jinja").unlink()
    (path / MARKER_NAME).write_text(json.dumps({"format": 1, "source": DEMO_GGUF}))
    return path


@pytest.fixture(scope="module")
def server(tok_ckpt: Path) -> Iterator[tuple[LiveServer, Any]]:
    live, engine = start_server(tok_ckpt)
    yield live, engine
    live.stop()
