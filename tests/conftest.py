"""Hypothesis profiles, picked with the ``HYPOTHESIS_PROFILE`` environment variable.

- ``ci`` (default): 200 examples of up to 40 steps each, what ``make test`` runs;
- ``dev``: 50 examples, for quick local iterations;
- ``thorough``: 10,000 examples (``HYPOTHESIS_PROFILE=thorough make test``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

for _name, _examples in (("ci", 200), ("dev", 50), ("thorough", 10_000)):
    settings.register_profile(
        _name,
        max_examples=_examples,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
