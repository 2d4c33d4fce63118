"""The investigations' tests (``make test-research``; ``make test-all`` runs them with
``tests/``). None of them is part of the default ``make test``, and no test there
imports ``research/``.

The scripts import each other and the maintained harnesses by name, as they do when run
as ``python research/NAME.py``: ``research/`` and ``benchmarks/`` go on ``sys.path``
here. Without CUDA, Triton kernels run in Triton's CPU interpreter, which must be asked
for before any ``@triton.jit`` decorator runs (as in ``tests/conftest.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT / "benchmarks", ROOT / "research"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
