"""``lru`` makes vLLM 0.33's decisions block for block on the shared harness's workload.

``benchmarks/bench_manager.py`` replays the workload through vLLM's real manager and
ours and exits non-zero when ``lru``'s fingerprint (every request's hit tokens and every
prefill's block ids) differs from vLLM's in ``full`` or ``hybrid`` (one full-attention
and two sliding-window groups). It runs under the baseline's venv (vLLM's pure
dependencies); skipped where the baseline is not set up
(``bash ../shared/bench/vllm_baseline/setup.sh``). The release order it pins, each
group's table in turn, is also checked without vLLM: ``tests/test_state_machine.py``
and the worked example below.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from factories import full, manager, req, swa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from vllm_ref.source import BASELINE_ROOT, default_harness, default_vllm_src  # noqa: E402

PYTHON = BASELINE_ROOT / "venv" / "bin" / "python"


@pytest.mark.skipif(
    not (PYTHON.exists() and default_vllm_src().is_dir() and default_harness().is_dir()),
    reason="vLLM baseline absent (bash ../shared/bench/vllm_baseline/setup.sh)",
)
def test_lru_gives_vllms_fingerprint() -> None:
    argv = ["--configs", "full", "hybrid", "--policy", "lru", "--requests", "150"]
    argv += ["--rounds", "1", "--retries", "0", "--hash-prompt-len", "200", "--hash-iters", "1"]
    run = subprocess.run(
        [str(PYTHON), str(ROOT / "benchmarks" / "bench_manager.py"), *argv],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [r for r in run.stdout.splitlines() if r.startswith("| same decisions")]
    assert rows == ["| same decisions: hits and block ids (fingerprint) | | yes | |"] * 2


def test_lru_releases_each_groups_table_in_turn() -> None:
    """Full attention (blocks 1-3) and a sliding window of 8 (blocks 4-6), block 4,
    10 tokens: the last blocks (3, 6) are partial, so hashless. vLLM frees group by
    group, tail first: hashed 2, 1 then 5, 4 to the tail; hashless 3, then 6 at the
    head, 6 first (the later group's release comes later)."""
    kv = manager(64, full(4), swa(4, 8))
    a = req("a", 10)
    assert kv.allocate_slots(a, 10).get_block_ids() == ([1, 2, 3], [4, 5, 6])
    a.num_computed_tokens = 10
    before = [b.block_id for b in kv.block_pool.policy if b.block_id > 6]
    kv.free(a)
    assert [b.block_id for b in kv.block_pool.policy] == [6, 3, *before, 2, 1, 5, 4]


def test_lru_puts_a_releases_hashless_blocks_at_the_head_in_its_order() -> None:
    """Prefix caching off: every block is hashless. vLLM's free queue takes one
    release's hashless blocks to its head in release order (``prepend_n``): the
    full table's 3, 2, 1, then the window's 6, 5, 4 before them."""
    kv = manager(64, full(4), swa(4, 8), enable_caching=False)
    a = req("a", 10)
    assert kv.allocate_slots(a, 10).get_block_ids() == ([1, 2, 3], [4, 5, 6])
    a.num_computed_tokens = 10
    kv.free(a)
    assert [b.block_id for b in kv.block_pool.policy][:7] == [6, 5, 4, 3, 2, 1, 7]
