"""The core's public paths as scripts, for a fresh interpreter (``test_light_core``,
``test_bare_install``): each runs them and prints which ``HEAVY`` modules got imported.
``CORE_PATHS``: the manager, the planner, ``hybridkv plan`` and ``--help``;
``SIMULATE``: ``hybridkv simulate`` (the engine's scheduler, no model).
"""

HEAVY = ("torch", "transformers", "triton", "matplotlib", "jinja2", "safetensors")

# Runs the core's public paths: specs, the manager and coordinators on a hybrid
# config, the planner and layouts (YAML), `hybridkv plan` and `hybridkv --help`.
CORE_PATHS = """
import contextlib, io, json, sys

import hybridkv
from hybridkv import FullAttentionSpec, KVCacheManager, MambaSpec, Request, SlidingWindowSpec
from hybridkv.cli import main
from hybridkv.coordinators import HybridKVCacheCoordinator  # noqa: F401
from hybridkv.layouts import dump_layout, layout_from_dict, shipped_layout
from hybridkv.planning import get_kv_cache_config, plan_kv_cache

full = FullAttentionSpec(4, 2, 8, "bf16")
assert full.dtype == "bfloat16" and full.page_size_bytes == 2 * 4 * 2 * 8 * 2
assert MambaSpec(4, ((3, 4), (2, 4)), ("fp32", "bf16")).state_size_bytes == 48 + 16
specs = {"layers.0": full, "layers.1": SlidingWindowSpec(4, 2, 8, "bf16", sliding_window=4)}
config = get_kv_cache_config(specs, 1 << 20, max_model_len=256)
manager = KVCacheManager(config, 256)
req = Request("r", list(range(200)))  # 200 tokens: token_ids' long-list path too
assert manager.allocate_slots(req, 64) is not None
layout = shipped_layout("tiny-jamba")
assert layout_from_dict(__import__("yaml").safe_load(dump_layout(layout))) == layout
assert plan_kv_cache(layout, 1 << 22, block_size=4).num_blocks > 1
out = io.StringIO()
with contextlib.redirect_stdout(out):
    assert main(["plan", "gemma-3-27b", "--memory", "80GB", "--verbose"]) == 0
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
assert "Capacity" in out.getvalue() and "simulate" in out.getvalue()
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""

# `hybridkv simulate` of a small token trace on the shipped tiny-jamba layout (the
# engine's scheduler on the cost model): argv[1] is a folder to write the trace and
# the --json results into. Checks the run and prints the HEAVY modules it imported.
SIMULATE = """
import contextlib, io, json, sys
from pathlib import Path

from hybridkv.cli import main

folder = Path(sys.argv[1])
doc = list(range(10, 42))  # 32 shared tokens: 2 blocks of 16
rows = [{"timestamp": 20 * i, "prompt_token_ids": doc + [100 + i] * (3 + 5 * i),
         "output_length": 2 + i % 3} for i in range(7)]
trace = folder / "trace.jsonl"
trace.write_text("".join(json.dumps(r) + "\\n" for r in rows), encoding="utf-8")
argv = ["simulate", "tiny-jamba", "--trace", str(trace), "--memory", "4MiB,8MiB",
        "--policy", "lru,hybrid", "--active-params", "1e9", "--no-progress",
        "--json", str(folder / "results.json")]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    assert main(argv) == 0
results = json.loads((folder / "results.json").read_text())
assert [r["num_requests"] for r in results] == [7] * 4, results
assert all(r["hit_tokens"] > 0 and r["ttft_p99_s"] > r["ttft_p50_s"] for r in results), results
assert "tiny-jamba" in out.getvalue()
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""
