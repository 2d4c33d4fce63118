"""Text in and out: the checkpoint's tokenizer and chat template, when it has them.

``load_tokenizer(model_dir)`` returns a transformers tokenizer or ``None``
when the directory holds no tokenizer files (token-id prompts still work;
text prompts and ``chat`` then raise ``ValueError`` saying so).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hybridkv.common.user_errors import one_line
from hybridkv.engine.chat_template import missing_template_message

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json")


def _check_json_files(model_dir: Path) -> None:
    for name in _JSON_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a valid tokenizer file ({one_line(e)})") from None


def load_tokenizer(model_dir: Path) -> Any | None:
    """The checkpoint's tokenizer, or ``None`` without tokenizer files.

    A tokenizer file that is not valid JSON, or one transformers cannot
    load, raises ``ValueError`` naming the file (or the folder) on one line.
    """
    if not any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
        return None
    _check_json_files(model_dir)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:  # tokenizers raises plain Exceptions on bad files
        raise ValueError(
            f"{model_dir}: the tokenizer files cannot be loaded ({type(e).__name__}: {one_line(e)})"
        ) from e
    templates = getattr(tokenizer, "chat_template", None)
    if isinstance(templates, str):
        templates = {"default": templates}
    for name, template in (templates or {}).items():
        where = next(
            (str(model_dir / f) for f in _TEMPLATE_FILES if (model_dir / f).is_file()),
            str(model_dir),
        )
        check_chat_template(template, f"{where} (chat template {name!r})")
    return tokenizer


def check_chat_template(template: Any, where: str = "chat_template") -> str:
    """``template`` if it is a Jinja template that compiles; else ``ValueError`` naming ``where``.

    Checked before any request is queued (and when a checkpoint is loaded).
    """
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"{where} must be a non-empty Jinja template string, got {template!r}")
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        env.parse(template)
    except TemplateSyntaxError as e:
        raise ValueError(
            f"{where}: not a valid Jinja template (line {e.lineno}: {one_line(e.message or e)})"
        ) from None
    return template


def read_chat_template(path: str | Path) -> str:
    """The Jinja chat template in file ``path`` (``--chat-template``), checked;
    ``ValueError`` naming the file when it cannot be read or does not compile."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--chat-template {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--chat-template {path}: not UTF-8 text") from None
    return check_chat_template(text, f"--chat-template {path}")


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
        raise ValueError(missing_template_message("pass chat_template=..."))
    if chat_template is not None:
        check_chat_template(chat_template)
    for k, msg in enumerate(conversation):
        if not isinstance(msg, Mapping) or "role" not in msg or "content" not in msg:
            raise ValueError(f"messages[{k}] must be a dict with 'role' and 'content', got {msg!r}")
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(
            [dict(m) for m in conversation],
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=True,
        )
    except TemplateError as e:
        where = "chat_template" if chat_template is not None else "the checkpoint's chat template"
        raise ValueError(f"{where} failed on this conversation: {one_line(e)}") from None
    if isinstance(ids, Mapping) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def encode_conversations(
    tokenizer: Any, messages: Sequence[Any], chat_template: str | None = None
) -> list[list[int]]:
    """``encode_chat`` of one conversation (a list of message dicts) or of a list of
    them; ``ValueError`` naming an empty or malformed one."""
    if not isinstance(messages, Sequence) or len(messages) == 0:
        raise ValueError("messages must be a non-empty list of messages or of conversations")
    conversations = [messages] if isinstance(messages[0], Mapping) else list(messages)
    out = []
    for k, conv in enumerate(conversations):
        if not isinstance(conv, Sequence) or len(conv) == 0:
            raise ValueError(f"conversation {k} must be a non-empty list of messages")
        out.append(encode_chat(tokenizer, conv, chat_template))
    return out
