"""`hybridkv walkthrough` prints a worked example whose numbers are the manager's."""

from __future__ import annotations

import pytest

from hybridkv.cli import main


def test_demo_prints_the_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["walkthrough"]) == 0
    out = capsys.readouterr().out
    # A: nothing cached; 15 tokens in blocks of 4 -> 4 blocks per group.
    assert "lookup: 0 of 15 prompt tokens cached" in out
    assert "prefill 15 tokens -> new blocks ([1, 2, 3, 4], [5, 6, 7, 8])" in out
    # B shares A's 12-token system prompt: 3 full blocks hit; the sliding group
    # (W=6) needs only tokens 7..11, so its first block comes back null.
    assert "lookup: 12 of 16 prompt tokens cached (hit blocks ([1, 2, 3], [0, 6, 7]))" in out
    # C: same tokens, another salt -> no hit.
    assert out.count("lookup: 0 of 16 prompt tokens cached") == 1
    assert "allocate_slots -> None" in out
    assert "All blocks free again: 15 of 15." in out


def test_cli_rejects_unknown_command() -> None:
    with pytest.raises(SystemExit):
        main(["nope"])
