"""The ``hybrid`` knobs of a replay: ``SimOptions.return_bonus`` / ``return_grade`` /
``value_weight`` / ``floor_tokens``, their way to the manager, the result's label and
JSON, and ``hybridkv simulate``'s ``--return-bonus`` / ``--return-grade`` /
``--value-weight`` / ``--floor-tokens`` sweeps and errors."""

from __future__ import annotations

import json
import math

import pytest
from test_sim_cli import ROWS, assert_one_line_error, simulate

import hybridkv.sim.replay as replay_module
from hybridkv.layouts import shipped_layout
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.cost_aware import CostAwareEvictionPolicy
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace
from hybridkv.sim.plot import curves


@pytest.mark.parametrize("field", ["return_bonus", "value_weight"])
@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, True, "2"])
def test_options_reject_a_bad_knob_naming_it(field, value) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be a finite number >= 0"):
        SimOptions(memory_bytes=10**9, policy="hybrid", **{field: value})


@pytest.mark.parametrize("field", ["return_bonus", "value_weight"])
def test_a_knob_under_lru_is_an_error(field) -> None:
    with pytest.raises(ValueError, match=f"^{field} tunes the hybrid policy.*'lru'"):
        SimOptions(memory_bytes=10**9, policy="lru", **{field: 1.0})


@pytest.mark.parametrize("value", [-1, 1.5, True, "16"])
def test_options_reject_a_bad_floor(value) -> None:
    with pytest.raises(ValueError, match=r"^floor_tokens must be an int >= 0"):
        SimOptions(memory_bytes=10**9, policy="hybrid", floor_tokens=value)


def test_a_floor_under_lru_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^floor_tokens tunes the hybrid policy.*'lru'"):
        SimOptions(memory_bytes=10**9, policy="lru", floor_tokens=8960)


@pytest.mark.parametrize("value", ["steep", "", "Turn", 1])
def test_options_reject_a_bad_grade(value) -> None:
    with pytest.raises(ValueError, match=r"^return_grade must be one of flat, turn, log-turn"):
        SimOptions(memory_bytes=10**9, policy="hybrid", return_grade=value)


def test_a_grade_under_lru_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^return_grade tunes the hybrid policy.*'lru'"):
        SimOptions(memory_bytes=10**9, policy="lru", return_grade="turn")


def test_hybrid_options_are_the_ones_set() -> None:
    assert SimOptions(memory_bytes=1, policy="hybrid").hybrid == HybridOptions()
    assert SimOptions(memory_bytes=1, policy="hybrid", return_bonus=0).hybrid == HybridOptions(
        return_bonus=0.0
    )
    both = SimOptions(memory_bytes=1, policy="hybrid", return_bonus=8, value_weight=0.5)
    assert both.hybrid == HybridOptions(return_bonus=8.0, value_weight=0.5)
    floor = SimOptions(memory_bytes=1, policy="hybrid", floor_tokens=0)
    assert floor.hybrid == HybridOptions(floor_tokens=0)
    graded = SimOptions(memory_bytes=1, policy="hybrid", return_grade="log-turn")
    assert graded.hybrid == HybridOptions(return_grade="log-turn")
    tuned = SimOptions(memory_bytes=1, policy="hybrid", tuning="floor_ratio=16,learn_returning=off")
    assert tuned.hybrid.tuning == HybridTuning(floor_ratio=16, learn_returning=False)
    with pytest.raises(ValueError, match="unknown tuning floor_rate"):
        SimOptions(memory_bytes=1, policy="hybrid", tuning="floor_rate=16")
    with pytest.raises(ValueError, match="it changes nothing under"):
        SimOptions(memory_bytes=1, policy="lru", tuning="floor_ratio=16")


def replay(write_trace, **knobs):
    """Two requests of a 1 full + 3 sliding layout under ``hybrid``; the
    manager the replay built is returned with the result."""
    built = []
    real = replay_module.KVCacheManager

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    layout = shipped_layout("toy-1full-3sliding")
    rows = [
        {"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [0]},
        {"timestamp": 10, "input_length": 300, "output_length": 4, "hash_ids": [0]},
    ]
    options = SimOptions(memory_bytes=2**24, policy="hybrid", **knobs)
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params=1e6)
    mp = pytest.MonkeyPatch()
    mp.setattr(replay_module, "KVCacheManager", spy)
    try:
        result = replay_trace(layout, load_trace(write_trace(rows)), options, cost)
    finally:
        mp.undo()
    (manager,) = built
    return result, manager


def test_the_knobs_reach_the_manager(write_trace) -> None:
    default, m0 = replay(write_trace)
    assert isinstance(m0.block_pool.policy, CostAwareEvictionPolicy)
    weight = HybridTuning().value_weight_sliding  # sliding windows: auto_value_weight
    assert m0.block_pool.policy.weight == weight
    assert m0.policy.return_factor == 2.0 ** (HybridTuning().return_bonus / weight)
    assert (default.return_bonus, default.value_weight) == (None, None)
    assert default.policy_label == "hybrid"
    tuned, m1 = replay(write_trace, return_bonus=2, value_weight=0.5)
    assert m1.block_pool.policy.weight == 0.5
    assert m1.policy.return_factor == 2.0 ** (2 / 0.5)
    assert (tuned.return_bonus, tuned.value_weight) == (2, 0.5)
    assert tuned.policy_label == "hybrid (bonus 2, weight 0.5)"
    assert tuned.to_json()["return_bonus"] == 2 and tuned.to_json()["value_weight"] == 0.5
    _, off = replay(write_trace, return_bonus=0)
    assert off.policy.seen is None  # bonus 0: no memory of seen prefixes
    assert m0.policy.floor_tokens == 3072  # 32 x (3 windows x 2 pages) x 16 tokens
    floored, m2 = replay(write_trace, floor_tokens=100)
    assert m2.policy.floor_tokens == 112  # rounded up to the 16-token hit step
    assert floored.policy_label == "hybrid (floor 100)"
    assert floored.to_json()["floor_tokens"] == 100
    assert m0.policy.seen.turns is False and default.to_json()["return_grade"] is None
    graded, m3 = replay(write_trace, return_bonus=2, return_grade="turn")
    assert m3.policy.seen.turns is True
    assert m3.policy.return_value(2) == 2.0 ** (2 * 2 / 1.0)
    assert graded.policy_label == "hybrid (bonus 2, grade turn)"
    assert graded.to_json()["return_grade"] == "turn"


def test_simulate_sweeps_the_knobs_of_hybrid_runs_only(
    capsys, one_full, write_trace, tmp_path
) -> None:
    out_json = tmp_path / "out.json"
    sweep = ["--memory", "1MB,2MB", "--policy", "lru,hybrid"]
    sweep += ["--return-bonus", "0,8", "--value-weight", "1"]
    trace = str(write_trace(ROWS))
    rc, out, err = simulate(
        capsys, str(one_full), "--trace", trace, *sweep, "--json", str(out_json)
    )
    assert rc == 0, err
    rows = [line for line in out.splitlines() if line.strip().startswith("one-full")]
    assert len(rows) == 6  # per budget: lru once, hybrid for each (bonus, weight)
    assert [row.split()[3] for row in rows] == ["lru", "hybrid", "hybrid"] * 2
    assert sum("hybrid (bonus 0, weight 1)" in row for row in rows) == 2
    assert sum("hybrid (bonus 8, weight 1)" in row for row in rows) == 2
    data = json.loads(out_json.read_text())
    knobs = [(r["policy"], r["return_bonus"], r["value_weight"]) for r in data]
    assert knobs == [("lru", None, None), ("hybrid", 0.0, 1.0), ("hybrid", 8.0, 1.0)] * 2
    rc, out, err = simulate(
        capsys, str(one_full), "--trace", trace, "--memory", "1MB", "--policy", "lru,hybrid",
        "--floor-tokens", "0,4096", "--json", str(out_json),
    )  # fmt: skip
    assert rc == 0, err
    data = json.loads(out_json.read_text())
    assert [(r["policy"], r["floor_tokens"]) for r in data] == [
        ("lru", None),
        ("hybrid", 0),
        ("hybrid", 4096),
    ]
    assert "hybrid (floor 4096)" in out
    rc, out, err = simulate(
        capsys, str(one_full), "--trace", trace, "--memory", "1MB", "--policy", "hybrid",
        "--return-grade", "flat,log-turn", "--return-bonus", "1", "--json", str(out_json),
    )  # fmt: skip
    assert rc == 0, err
    data = json.loads(out_json.read_text())
    assert [r["return_grade"] for r in data] == ["flat", "log-turn"]
    assert "hybrid (bonus 1, grade log-turn)" in out


def test_tuned_runs_are_curves_of_their_own(write_trace) -> None:
    a, _ = replay(write_trace)
    b, _ = replay(write_trace, return_bonus=8)
    assert set(curves([a, b])) == {"hybrid", "hybrid (bonus 8)"}


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--return-bonus", "4"], ["--return-bonus tunes the hybrid policy: add hybrid"]),
        (["--policy", "lru", "--value-weight", "1"], ["--value-weight tunes the hybrid"]),
        (["--policy", "hybrid", "--return-bonus", "-1"], ["--return-bonus must be finite", "'-1'"]),
        (["--policy", "hybrid", "--value-weight", "x"], ["--value-weight must be finite", "'x'"]),
        (["--policy", "hybrid", "--value-weight", "inf"], ["--value-weight must be finite"]),
        (["--policy", "hybrid", "--return-bonus", "nan"], ["--return-bonus must be finite"]),
        (["--policy", "hybrid", "--return-bonus", "1,,2"], ["--return-bonus has an empty entry"]),
        (["--floor-tokens", "8960"], ["--floor-tokens tunes the hybrid policy: add hybrid"]),
        (
            ["--policy", "hybrid", "--floor-tokens", "-16"],
            ["--floor-tokens must be an integer >= 0"],
        ),
        (["--policy", "hybrid", "--floor-tokens", "1.5"], ["--floor-tokens must be an integer"]),
        (["--return-grade", "turn"], ["--return-grade tunes the hybrid policy: add hybrid"]),
        (
            ["--policy", "hybrid", "--return-grade", "turn,steep"],
            ["--return-grade must be one of flat, turn, log-turn", "'steep'"],
        ),
    ],
)
def test_bad_knobs_are_one_line_and_exit_2(capsys, one_full, write_trace, argv, needles) -> None:
    path = str(write_trace(ROWS))
    rc, out, err = simulate(capsys, str(one_full), "--trace", path, "--memory", "1MB", *argv)
    assert_one_line_error(rc, out, err, *needles)


def test_simulate_takes_tuning_overrides_for_hybrid_runs(
    capsys, one_full, write_trace, tmp_path
) -> None:
    """``--tuning key=value`` reaches every hybrid run (label and JSON), is
    checked before the first replay, and is an error without hybrid."""
    out_json = tmp_path / "out.json"
    trace = str(write_trace(ROWS))
    run = ["--trace", trace, "--memory", "1MB", "--json", str(out_json)]
    rc, out, err = simulate(
        capsys, str(one_full), *run, "--policy", "lru,hybrid",
        "--tuning", "learn_returning=off", "--tuning", "floor_ratio=16",
    )  # fmt: skip
    assert rc == 0, err
    assert "hybrid (tuning learn_returning=off,floor_ratio=16)" in out
    data = json.loads(out_json.read_text())
    assert [r.get("tuning") for r in data] == [None, "learn_returning=off,floor_ratio=16"]
    rc, _, err = simulate(capsys, str(one_full), *run, "--policy", "hybrid", "--tuning", "x=1")
    assert rc == 2 and "unknown tuning x; known: tail_tokens" in err
    rc, _, err = simulate(capsys, str(one_full), *run, "--tuning", "floor_ratio=16")
    assert rc == 2 and "--tuning tunes the hybrid policy: add hybrid to --policy" in err
