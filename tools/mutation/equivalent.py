"""Surviving mutants judged equivalent (or not worth a test), each with its argument.

Keys are mutant keys as the report prints them. A survivor listed here is left
out of the kill rate's denominator; every other survivor counts against it. An
argument must say why no test can tell the mutant from the code (same
behaviour), or why the difference is not observable through any contract.
The report flags keys here that no longer match a mutant.
"""

from __future__ import annotations

EQUIVALENT: dict[str, str] = {}
