"""Hypothesis profiles, picked with the ``HYPOTHESIS_PROFILE`` environment variable.

- ``ci`` (default): 200 examples of up to 40 steps each, what ``make test`` runs;
- ``dev``: 50 examples, for quick local iterations;
- ``thorough``: 10,000 examples (``HYPOTHESIS_PROFILE=thorough make test``);
- ``mutation``: ``ci`` without shrinking or example database (``make mutation``).

Without CUDA, Triton kernels run in Triton's CPU interpreter: ``TRITON_INTERPRET``
must be set before any ``@triton.jit`` decorator runs, so it is set here, before
any test module imports ``hybridkv.kernels``.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, Phase, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

for _name, _examples in (("ci", 200), ("dev", 50), ("thorough", 10_000)):
    settings.register_profile(
        _name,
        max_examples=_examples,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

# Mutation runs (``make mutation``): a failure is all that counts, so no shrinking and no
# example database (a mutant's failure must not leak into the next run).
settings.register_profile(
    "mutation",
    settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.generate, Phase.target],
    database=None,
)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
