"""``hybridkv simulate``: the table, ``--json``, ``--plot``, and one-line user errors."""

from __future__ import annotations

import json

import pytest

from hybridkv.cli import main

ROWS = [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]},
    {"timestamp": 5, "input_length": 1300, "output_length": 4, "hash_ids": [0, 1, 2]},
    {"timestamp": 9, "input_length": 600, "output_length": 4, "hash_ids": [0, 3]},
]
# One request of the one-full layout (1304 tokens: 82 blocks of 512 B) and the null
# block need 83 * 512 = 42,496 bytes.
MIN_BYTES = 83 * 512


def simulate(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["simulate", *argv, "--no-progress", "--active-params", "1e9"])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, out: str, err: str, *needles: str) -> None:
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hybridkv simulate: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


def test_table_and_json_of_two_budgets_and_two_policies(capsys, one_full, write_trace, tmp_path):
    out_json = tmp_path / "out.json"
    rc, out, err = simulate(
        capsys,
        str(one_full),
        "--trace",
        str(write_trace(ROWS)),
        "--memory",
        "1MB,2MB",
        "--policy",
        "lru,lru",
        "--json",
        str(out_json),
    )
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("Replay of ")
    assert "3 requests, 2,924 prompt tokens, 12 output tokens; device h100" in lines[0]
    rows = [line for line in lines if line.strip().startswith("one-full")]
    assert len(rows) == 4
    assert [row.split()[1:3] for row in rows] == [["1", "MB"]] * 2 + [["2", "MB"]] * 2
    # hits: r1 1024, r2 512 of 2924 prompt tokens
    assert all(f"{100 * 1536 / 2924:.2f}%" in row for row in rows)
    data = json.loads(out_json.read_text())
    assert isinstance(data, list) and len(data) == 4
    first = data[0]
    assert first["token_hit_rate"] == 1536 / 2924
    assert first["memory_bytes"] == 10**6 and data[2]["memory_bytes"] == 2 * 10**6
    for key in (
        "layout",
        "policy",
        "trace",
        "prompt_tokens",
        "hit_tokens",
        "prefill_tokens",
        "decode_tokens",
        "output_tokens",
        "preemptions",
        "cached_blocks",
        "cached_bytes",
        "peak_blocks_in_use",
        "peak_blocks_by_kind",
        "in_use_mean",
        "in_use_p50",
        "ttft_p50_s",
        "ttft_p99_s",
        "output_tokens_per_s",
        "makespan_s",
        "replay_seconds",
        "num_blocks",
        "page_bytes",
    ):
        assert key in first
    assert first["cached_bytes"]["full"] == first["cached_blocks"]["full"] * 512
    assert f"results written to {out_json}" in out


def test_one_run_writes_one_json_object(capsys, one_full, write_trace, tmp_path):
    out_json = tmp_path / "one.json"
    rc, _, err = simulate(
        capsys,
        str(one_full),
        "--trace",
        str(write_trace(ROWS)),
        "--memory",
        "1MB",
        "--json",
        str(out_json),
        "--requests",
        "2",
        "--arrivals",
        "closed",
    )
    assert rc == 0, err
    data = json.loads(out_json.read_text())
    assert data["num_requests"] == 2 and data["arrivals"] == "closed"
    assert data["token_hit_rate"] == 1024 / (1024 + 1300)


def test_plot_writes_a_png_for_two_budgets(capsys, one_full, write_trace, tmp_path):
    png = tmp_path / "hit.png"
    rc, out, err = simulate(
        capsys,
        str(one_full),
        "--trace",
        str(write_trace(ROWS)),
        "--memory",
        "1MB,2MB",
        "--plot",
        str(png),
    )
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure written to {png}" in out


def test_progress_bar_goes_to_stderr(capsys, one_full, write_trace):
    rc = main(
        [
            "simulate",
            str(one_full),
            "--trace",
            str(write_trace(ROWS)),
            "--memory",
            "1MB",
            "--active-params",
            "1e9",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    assert "one-full 1 MB lru" in err and "3/3" in err
    assert "3/3" not in out


@pytest.mark.parametrize(
    ("rows", "argv", "needles"),
    [
        (["{oops"], [], ["trace.jsonl:1: not JSON"]),
        ([{"output_length": 1, "hash_ids": [0]}], [], ["trace.jsonl:1: missing 'input_length'"]),
        ([{"input_length": 5, "output_length": 1}], [], ["trace.jsonl:1: missing 'hash_ids'"]),
        (
            [{"input_length": -5, "output_length": 1, "hash_ids": [0]}],
            [],
            ["trace.jsonl:1: input_length must be >= 1, got -5"],
        ),
        (
            [{"input_length": 5, "output_length": -2, "hash_ids": [0]}],
            [],
            ["output_length must be >= 1, got -2"],
        ),
        (ROWS, ["--policy", "lfu"], ["policy must be one of lru, hybrid, got 'lfu'"]),
        (ROWS, ["--policy", "lru,bogus"], ["got 'bogus'"]),
        (ROWS, ["--plot", "x.png"], ["--plot", "at least 2 budgets"]),
        (ROWS, ["--requests", "-3"], ["--requests must be an integer >= 1, got -3"]),
        (ROWS, ["--output-tokens", "zero"], ["--output-tokens must be an integer"]),
        (ROWS, ["--arrivals", "poisson"], ["arrivals must be one of trace, closed"]),
        (ROWS, ["--device", "tpu"], ["device must be one of h100, h200, a100, got 'tpu'"]),
        (ROWS, ["--host-memory", "12XB"], ["--host-memory: cannot read memory size '12XB'"]),
        (
            ROWS,
            ["--max-model-len", "100"],
            ["trace line 2: the request needs 1,304 tokens", "--max-model-len 100"],
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, one_full, write_trace, rows, argv, needles):
    path = write_trace(rows)
    rc, out, err = simulate(capsys, str(one_full), "--trace", str(path), "--memory", "1MB", *argv)
    assert_one_line_error(rc, out, err, *needles)


def test_a_budget_below_one_request_names_the_minimum(capsys, one_full, write_trace):
    path = str(write_trace(ROWS))
    rc, out, err = simulate(capsys, str(one_full), "--trace", path, "--memory", "20KB")
    assert_one_line_error(
        rc, out, err, "memory: 20,000 bytes cannot hold one request", f"{MIN_BYTES:,} bytes"
    )
    rc, _, _ = simulate(capsys, str(one_full), "--trace", path, "--memory", f"{MIN_BYTES}")
    assert rc == 0
    # A later budget too small fails before the first replay (nothing printed).
    rc, out, err = simulate(capsys, str(one_full), "--trace", path, "--memory", "1MB,20KB")
    assert_one_line_error(rc, out, err, "20,000 bytes cannot hold")


def test_unknown_layout_and_missing_active_params(capsys, write_trace):
    path = str(write_trace(ROWS))
    rc = main(["simulate", "toy-1full-3sliding", "--trace", path, "--memory", "1GB"])
    out, err = capsys.readouterr()
    assert_one_line_error(rc, out, err, "no active parameter count", "--active-params")
    rc, out, err = simulate(capsys, "no-such-model", "--trace", path, "--memory", "1GB")
    assert_one_line_error(rc, out, err, "no model 'no-such-model'")
    rc, out, err = simulate(capsys, "gemma-3-1b", "--trace", path + ".missing", "--memory", "1GB")
    assert_one_line_error(rc, out, err, "cannot read trace")


def test_fixed_output_tokens_and_sha256_vs_xxhash_agree(capsys, one_full, write_trace, tmp_path):
    results = []
    for algo in ("sha256", "xxhash"):
        out_json = tmp_path / f"{algo}.json"
        rc, _, err = simulate(
            capsys,
            str(one_full),
            "--trace",
            str(write_trace(ROWS)),
            "--memory",
            "1MB",
            "--output-tokens",
            "2",
            "--hash-algo",
            algo,
            "--json",
            str(out_json),
        )
        assert rc == 0, err
        results.append(json.loads(out_json.read_text()))
    assert results[0]["output_tokens"] == 3 * 2
    assert results[0]["decode_tokens"] == 3 * 1
    assert results[0]["hit_tokens"] == results[1]["hit_tokens"] == 1024 + 512
