"""Our adapter replays the shared vLLM-baseline workload correctly.

The replay harness (``../shared/bench/vllm_baseline/bench_vllm.py``) imports
only the standard library at module level, so it runs here without vLLM. The
expected hit count is computed independently: with no eviction, a request hits
its whole 1,024-token prefix iff an earlier-admitted request used the same one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT.parent / "shared" / "bench" / "vllm_baseline" / "bench_vllm.py"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(
    not HARNESS.exists(), reason="shared/bench/vllm_baseline is not beside the repo"
)
@pytest.mark.parametrize("kind", ["full", "hybrid", "hybrid_mamba"])
def test_replay_matches_expected_hits(kind: str) -> None:
    harness = _load("bench_vllm", HARNESS)
    adapter_mod = _load("hybridkv_adapter", ROOT / "benchmarks" / "hybridkv_adapter.py")
    a = harness.parse_args(["--requests", "40", "--decode-steps", "4", "--no-fingerprint-blocks"])
    workload = harness.make_workload(a)
    config = adapter_mod.make_config(kind, a.block_size, a.num_blocks, a.window)
    adapter = adapter_mod.HybridkvAdapter(config, a)
    res = harness.replay(adapter, workload, a)

    seen: set[int] = set()
    expected_hits = 0
    for _rid, prefix_id, _prompt, _outs in workload:
        if prefix_id in seen:
            expected_hits += a.prefix_len
        seen.add(prefix_id)
    assert res["hit_tokens"] == expected_hits
    assert res["prefill_alloc_failures"] == res["decode_alloc_failures"] == 0
    assert res["free_blocks_at_end"] == a.num_blocks - 1
    adapter.kv.check_integrity()


@pytest.mark.skipif(
    not HARNESS.exists(), reason="shared/bench/vllm_baseline is not beside the repo"
)
def test_eviction_count_is_the_pools() -> None:
    # 200 blocks hold 12 requests of 80 blocks' prompts: the pool must evict cached ones.
    harness = _load("bench_vllm", HARNESS)
    adapter_mod = _load("hybridkv_adapter", ROOT / "benchmarks" / "hybridkv_adapter.py")
    argv = ["--requests", "40", "--decode-steps", "4", "--num-blocks", "200", "--max-running", "2"]
    a = harness.parse_args(argv)
    config = adapter_mod.make_config("full", a.block_size, a.num_blocks, a.window)
    adapter = adapter_mod.HybridkvAdapter(config, a)
    counter = adapter.install_eviction_counter()
    harness.replay(adapter, harness.make_workload(a), a)
    assert counter[0] == adapter.kv.block_pool.num_evicted_blocks > 0
