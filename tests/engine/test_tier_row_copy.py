"""A host-tier hit under either row copy (``$HYBRIDKV_ROW_COPY``): the same tokens
as an engine without tiers, and the tier says which copy moved its rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tier_engine import DOC, OTHER, _gen, _tiered, _want, ckpt, cold  # noqa: F401

from hybridkv.common import env
from hybridkv.engine import LLM
from hybridkv.kernels.cpu import native_status


@pytest.mark.parametrize("mode", ["native", "numpy"])
def test_a_host_hit_is_exact_under_either_row_copy(
    ckpt: Path,  # noqa: F811
    cold: LLM,  # noqa: F811
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if mode == "native" and native_status() is not None:
        pytest.skip(f"the native row copy cannot be built here: {native_status()}")
    monkeypatch.setenv(env.ROW_COPY, mode)
    llm = _tiered(ckpt, cold)
    assert llm.tiers is not None and llm.tiers.host is not None
    assert llm.tiers.host.copies.row_copy == mode
    _gen(llm, DOC)
    _gen(llm, OTHER)  # its allocation reuses the first document's blocks
    tokens, hit = _gen(llm, [*DOC, 7, 8])
    assert tokens == _want(cold, [*DOC, 7, 8])
    assert llm.tiers.stats.hit_tokens == hit > 0 and llm.tiers.host.copies.load.bytes > 0
    llm.close()
