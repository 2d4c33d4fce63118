"""``ProgressLine``: the replay's progress on stderr, redrawn in place, ended by ``close``."""

from __future__ import annotations

import io

from hybridkv.sim.progress import ProgressLine


def test_draws_at_start_throttles_and_ends_with_the_final_count() -> None:
    out = io.StringIO()
    bar = ProgressLine(4, "tiny lru", stream=out, min_interval=3600.0)
    assert out.getvalue().startswith("\rtiny lru:   0% 0/4 req [00:00 elapsed, ? left")
    bar.update(1)
    bar.update(2)
    assert out.getvalue().count("\r") == 1  # within min_interval: not redrawn
    bar.update(1)
    bar.close()
    final = out.getvalue().split("\r")[-1]
    assert final.startswith("tiny lru: 100% 4/4 req [") and final.endswith(" req/s]\n")
    assert "00:00 left" in final


def test_redraws_every_update_without_an_interval() -> None:
    out = io.StringIO()
    bar = ProgressLine(3, "x", stream=out, min_interval=0.0)
    bar.update(1)
    bar.update(1)
    assert [line.split(" req")[0] for line in out.getvalue().split("\r")[1:]] == [
        "x:   0% 0/3",
        "x:  33% 1/3",
        "x:  66% 2/3",
    ]
