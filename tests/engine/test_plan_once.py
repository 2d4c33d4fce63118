"""The engine plans its KV cache once: one unify-and-group pass, then a fit to memory.

``LLM`` without ``kv_cache_memory_bytes`` sizes its budget from the ``PagePlan``
(``engine_setup.default_kv_bytes``) and fits that same plan to it; with it, it
fits directly. Either way ``grouping_candidates`` (the planner's costing of
every group size) runs once.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from engine.tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv import FullAttentionSpec
from hybridkv.engine import LLM
from hybridkv.engine.engine_setup import DEFAULT_KV_CAP_BYTES, default_kv_bytes
from hybridkv.planning import PagePlan, fit_memory, plan_pages
from hybridkv.planning import planner as planner_module


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("plan_once"))


@pytest.mark.parametrize("memory", [None, 200_000])
def test_llm_plans_once(ckpt: Path, memory: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = planner_module.grouping_candidates

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(planner_module, "grouping_candidates", counted)
    llm = LLM(ckpt, block_size=4, max_model_len=64, max_num_seqs=3, kv_cache_memory_bytes=memory)
    assert len(calls) == 1
    pages = PagePlan(**{f.name: getattr(llm.plan, f.name) for f in fields(PagePlan)})
    want = memory or default_kv_bytes(pages, 3)
    assert llm.plan.available_memory_bytes == want
    assert llm.plan == fit_memory(pages, want)


def test_default_kv_bytes_reads_the_page_plan() -> None:
    full = FullAttentionSpec(4, 2, 8, "float32")  # 512 B pages; 16 blocks per 64 tokens
    pages = plan_pages(
        {"a": full, "b": full}, block_size=4, max_model_len=64, max_num_batched_tokens=16
    )
    per_request = 2 * 16 * 512
    assert pages.bytes_per_request == per_request
    floor = per_request + pages.page_bytes * (2 + 16 // 4)
    assert default_kv_bytes(pages, 1) == floor  # one request is below the floor
    assert default_kv_bytes(pages, 100) == per_request * 100
    assert default_kv_bytes(pages, 10**9) == DEFAULT_KV_CAP_BYTES
