"""Text in and out: the checkpoint's tokenizer and chat template, when it has them.

``load_tokenizer(model_dir)`` returns a transformers tokenizer or ``None``
when the directory holds no tokenizer files (token-id prompts still work;
text prompts and ``chat`` then raise ``ValueError`` saying so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def load_tokenizer(model_dir: Path) -> Any | None:
    """The checkpoint's tokenizer, or ``None`` without tokenizer files."""
    if not any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def encode_chat(
    tokenizer: Any, conversation: Sequence[Mapping[str, Any]], chat_template: str | None = None
) -> list[int]:
    """Token ids of ``conversation`` rendered by the chat template, ready for the reply.

    ``chat_template`` (Jinja) overrides the tokenizer's; without either,
    ``ValueError`` says so.
    """
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer, and this checkpoint has none")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat needs a chat template, and this checkpoint's tokenizer has none; "
            "pass chat_template=..."
        )
    for k, msg in enumerate(conversation):
        if not isinstance(msg, Mapping) or "role" not in msg or "content" not in msg:
            raise ValueError(f"messages[{k}] must be a dict with 'role' and 'content', got {msg!r}")
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in conversation],
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=True,
    )
    if isinstance(ids, Mapping) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]
