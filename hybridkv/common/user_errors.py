"""User errors as the command line shows them: one line, exit status 2, no traceback.

Library code raises ``ValueError`` (or a subclass) whose message names the
culprit (the file, the argument) and the problem; each subcommand catches it
and calls ``report``. Where a message wraps text from another library
(transformers, jinja2), the raiser folds it with ``one_line``; a message that
lists several problems on purpose (a YAML layout's) keeps one line each.
"""

from __future__ import annotations

import sys

EXIT_USER_ERROR = 2


def one_line(error: BaseException | str) -> str:
    """The message of ``error`` with every run of whitespace (newlines too) as one space."""
    return " ".join(str(error).split())


def report(command: str, error: BaseException | str) -> int:
    """Print ``hybridkv COMMAND: error: MESSAGE`` on stderr; return ``EXIT_USER_ERROR``."""
    print(f"hybridkv {command}: error: {error}", file=sys.stderr)
    return EXIT_USER_ERROR
