"""``hybridkv simulate --host-memory/--disk``: the table, the plot, the help, errors."""

from __future__ import annotations

import json

import pytest

from hybridkv.cli import main

ROWS = [
    {"timestamp": 10 * i, "input_length": 1024, "output_length": 4, "hash_ids": [i % 3, i]}
    for i in range(12)
]


def simulate(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["simulate", *argv, "--no-progress", "--active-params", "1e9"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_tier_columns_json_and_plot(capsys, one_full, write_trace, tmp_path):
    png, out_json = tmp_path / "tiers.png", tmp_path / "tiers.json"
    argv = ["--trace", str(write_trace(ROWS)), "--memory", "50KB", "--policy", "lru,hybrid"]
    argv += ["--host-memory", "20KB,1MB", "--disk", "1MB", "--plot", str(png)]
    rc, out, err = simulate(capsys, str(one_full), *argv, "--json", str(out_json))
    assert rc == 0, err
    header = out.splitlines()[1]
    for column in ("host", "+ host hits", "disk", "+ disk hits", "total hits", "load wait"):
        assert column in header
    rows = json.loads(out_json.read_text())
    assert [(r["host_memory_bytes"], r["policy"]) for r in rows] == [
        (20_000, "lru"),
        (20_000, "hybrid"),
        (1_000_000, "lru"),
        (1_000_000, "hybrid"),
    ]
    for r in rows:
        assert r["tiers"]["disk_memory_bytes"] == 1_000_000
        assert r["total_hit_rate"] == pytest.approx(
            r["token_hit_rate"] + r["host_hit_rate"] + r["disk_hit_rate"]
        )
        assert r["tiers"]["host_used_bytes"] <= r["host_memory_bytes"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_tier_means_no_tier_column_and_no_tier_json(capsys, one_full, write_trace, tmp_path):
    out_json = tmp_path / "plain.json"
    argv = ["--trace", str(write_trace(ROWS)), "--memory", "50KB", "--json", str(out_json)]
    rc, out, err = simulate(capsys, str(one_full), *argv)
    assert rc == 0, err
    assert "host" not in out.splitlines()[1] and "load wait" not in out
    row = json.loads(out_json.read_text())
    assert "tiers" not in row and "total_hit_rate" not in row
    assert row["host_memory_bytes"] is None and row["host_hit_tokens"] == 0


def test_help_states_the_links_and_their_source(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "h100 55 GB/s" in text and "a100 25 GB/s" in text and "h100 7 GB/s" in text
    assert "hybridkv/sim/devices.py" in text


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--disk", "1TB"], "--disk is the tier below the host: give --host-memory too"),
        (["--host-memory", "1MB", "--disk", "1TB,2TB"], "--disk takes one size"),
        (["--host-memory", "1MB", "--disk", "big"], "--disk: cannot read memory size 'big'"),
        (["--host-memory", "1MB", "--plot", "x.png"], "give --host-memory at least 2 sizes"),
        (["--host-memory", "1MB,,2MB"], "--host-memory has an empty entry"),
    ],
)
def test_bad_tier_options_are_one_line_and_exit_2(capsys, one_full, write_trace, argv, needle):
    path = str(write_trace(ROWS))
    rc, out, err = simulate(capsys, str(one_full), "--trace", path, "--memory", "1MB", *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
