"""Which chat template renders a conversation, when the caller names none.

First match wins:

1. the caller's (``LLM.chat(chat_template=...)``, ``--chat-template FILE``);
2. the checkpoint's own (its tokenizer's ``chat_template``);
3. the demo checkpoint (Gemma 3 270M converted from the demo package's GGUF: a
   base model whose GGUF holds no template) gets the demo's plain transcript,
   the package file ``chat_templates/transcript.jinja``::

       User: What is a cache?
       Assistant: A small fast memory.
       User: Why is it fast?
       Assistant:                     <- the reply starts here and ends at the line end

4. transformers' own default for the tokenizer, where the installed version has
   one (a ``default_chat_template`` attribute: transformers 4 before 4.43 had
   them for several tokenizer classes; transformers 5 has none for tokenizers);
5. none: a chat is refused with a ``ValueError`` that names the option to pass
   (``missing_template_message``).

Pure lookups on the loaded tokenizer and the checkpoint folder: nothing is
written, and a tokenizer is never changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hybridkv.models.demo_checkpoint import is_demo_checkpoint

TRANSCRIPT_FILE = "chat_templates/transcript.jinja"


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A conversation's template and where it came from."""

    text: str | None
    """The Jinja source; None: the tokenizer's own (``apply_chat_template``'s default)."""
    source: str
    """Where it came from, in words (start-up logs, docs)."""
    stop: tuple[str, ...] = ()
    """Strings a reply ends at under this template (the transcript's: its line end)."""


def transcript_template() -> str:
    """The demo's ``User: / Assistant:`` transcript template (a package data file)."""
    return resources.files("hybridkv.engine").joinpath(TRANSCRIPT_FILE).read_text("utf-8")


def default_chat_template(tokenizer: Any, model_dir: Path) -> ChatTemplate | None:
    """The template a chat without ``chat_template`` uses (rules 2-4), or None (rule 5)."""
    if tokenizer is None:
        return None
    if getattr(tokenizer, "chat_template", None):
        return ChatTemplate(None, f"the checkpoint's ({model_dir})")
    if is_demo_checkpoint(model_dir):
        return ChatTemplate(
            transcript_template(),
            f"the demo's plain transcript (hybridkv/engine/{TRANSCRIPT_FILE}): "
            "the demo checkpoint has no chat template",
            stop=("\n",),
        )
    fallback = getattr(tokenizer, "default_chat_template", None)
    if isinstance(fallback, str) and fallback.strip():
        return ChatTemplate(fallback, f"transformers' default for {type(tokenizer).__name__}")
    return None


def missing_template_message(fix: str) -> str:
    """Why a chat cannot be rendered (rule 5), ending with ``fix``."""
    return (
        "chat needs a chat template, and this checkpoint's tokenizer has none "
        f"(nor is there a default for it); {fix}"
    )
