"""What ``make mutation`` mutates, and which tests each file's mutants run.

``TARGETS``: globs (relative to the repository root) of the files whose
mutants are generated; new files under them are found automatically.
``TESTS``: for a path prefix, the test files that cover it, fastest first
(a mutant runs them with ``-x`` and stops at the first failure). The longest
matching prefix wins. Keep both in step with the code: a file no prefix
covers is an error, not a silently untested file.
"""

from __future__ import annotations

from pathlib import Path

TARGETS = (
    "hybridkv/core/*.py",
    "hybridkv/managers/*.py",
    "hybridkv/policy/*.py",
    "hybridkv/coordinators/*.py",
    "hybridkv/core/hashing.py",
    "hybridkv/managers/snapshots.py",
    "hybridkv/cache_manager/kv_cache_manager.py",
    "hybridkv/cache_manager/manager_checks.py",
    "hybridkv/cache_manager/admission_bound.py",
    "hybridkv/planning/*.py",
    "hybridkv/engine/scheduler.py",
)

_MANAGER_TESTS = (
    "tests/test_hybrid_policy.py",
    "tests/test_hybrid_release_by_hand.py",
    "tests/test_free_points.py",
    "tests/test_free_points_mixed_chunks.py",
    "tests/test_hybrid_release.py",
    "tests/test_free_stack.py",
    "tests/test_free_hit_count.py",
    "tests/test_window_hit_scan.py",
    "tests/test_admission_bound.py",
    "tests/test_hybrid_running_by_hand.py",
    "tests/test_shedding.py",
    "tests/test_returning.py",
    "tests/test_cost_aware.py",
    "tests/test_retention.py",
    "tests/test_snapshots.py",
    "tests/test_tail_alignment.py",
    "tests/test_fine_alignment.py",
    "tests/test_free_queue.py",
    "tests/test_uncache.py",
    "tests/test_hybrid.py",
    "tests/test_lifecycle.py",
    "tests/test_kv_event_keys.py",
    "tests/test_walkthrough.py",
    "tests/test_isolation.py",
    "tests/test_bad_input.py",
    "tests/hardening/test_manager_misuse.py",
    "tests/test_xxhash_collision.py",
    "tests/test_quiet_horizon.py",
    "tests/test_kv_events_mirror.py",
    "tests/test_state_machine.py",
    "tests/sim/test_sim_admission_bound.py",
)

TESTS: dict[str, tuple[str, ...]] = {
    "hybridkv/core/": _MANAGER_TESTS,
    "hybridkv/managers/": _MANAGER_TESTS,
    "hybridkv/policy/": _MANAGER_TESTS,
    "hybridkv/coordinators/": _MANAGER_TESTS,
    "hybridkv/managers/snapshots.py": _MANAGER_TESTS,
    "hybridkv/cache_manager/kv_cache_manager.py": _MANAGER_TESTS,
    "hybridkv/cache_manager/manager_checks.py": _MANAGER_TESTS,
    "hybridkv/cache_manager/admission_bound.py": _MANAGER_TESTS,
    "hybridkv/core/hashing.py": (
        "tests/test_hashing.py",
        "tests/test_isolation.py",
        "tests/test_xxhash_collision.py",
        "tests/test_lifecycle.py",
        "tests/test_state_machine.py",
    ),
    "hybridkv/planning/": (
        "tests/test_planner.py",
        "tests/test_memory_views.py",
        "tests/test_shipped_layouts.py",
        "tests/test_planner_properties.py",
        "tests/test_cli_plan.py",
    ),
    "hybridkv/engine/scheduler.py": (
        "tests/engine/test_scheduler_steps.py",
        "tests/engine/test_scheduler_and_cli.py",
        "tests/engine/test_llm_api.py",
        "tests/engine/test_jamba_oracle.py",
        "tests/sim/test_sim_admission_bound.py",
    ),
}


def target_files(root: Path) -> list[str]:
    """The files ``TARGETS`` names, sorted, without ``__init__.py`` re-export modules
    that hold no logic (only imports and ``__all__``)."""
    out = set()
    for pattern in TARGETS:
        for path in root.glob(pattern):
            rel = path.relative_to(root).as_posix()
            if path.name == "__init__.py" and not _has_logic(path):
                continue
            out.add(rel)
    return sorted(out)


def _has_logic(path: Path) -> bool:
    return "def " in path.read_text()


def tests_for(rel: str) -> tuple[str, ...]:
    """The test files mapped to ``rel`` (longest prefix); raises if none is."""
    matches = [prefix for prefix in TESTS if rel.startswith(prefix)]
    if not matches:
        raise KeyError(f"no tests are mapped to {rel}: add it to TESTS in targets.py")
    return TESTS[max(matches, key=len)]
