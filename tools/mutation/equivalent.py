"""Surviving mutants judged equivalent, each with its argument (``equivalent.yaml``).

Keys are mutant keys as the report prints them. A survivor listed there is left
out of the kill rate's denominator; every other survivor counts against it. An
argument must say why no test can tell the mutant from the code (same
behaviour, or a path no caller reaches). The report flags keys that no longer
match a mutant, and a unit test checks that each names a real mutant.
"""

from __future__ import annotations

from pathlib import Path

import yaml

EQUIVALENT: dict[str, str] = yaml.safe_load(
    (Path(__file__).with_name("equivalent.yaml")).read_text()
)
