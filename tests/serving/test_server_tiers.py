"""``hybridkv serve --kv-offloading-size --disk-cache-dir``: a tier hit over HTTP.

The second request's prefix comes back from the host tier once the pool has
reused every block (the same answer as the first time), ``/metrics`` counts
it by medium, and stopping the server writes the cache to the disk folder; with
``--async-scheduling`` too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from live_server import start_server
from serve_http import metrics, post


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_a_tier_hit_over_http_is_counted_and_kept_on_disk(
    tok_ckpt: Path, tmp_path: Path, overlap: bool
) -> None:
    disk = tmp_path / "kv"
    flags = {"async_scheduling": True} if overlap else {}
    live, engine = start_server(
        tok_ckpt, kv_offloading_size=0.01, disk_cache_dir=disk, disk_cache_size=0.01, **flags
    )
    try:
        assert (engine.llm.async_steps is not None) == overlap
        body = {"prompt": list(range(200, 241)), "max_tokens": 3, "temperature": 0}
        code, _, first = post(live.url, "/v1/completions", body)
        assert code == 200

        def evict(llm: object) -> None:  # the pool reuses every block, as under pressure
            pool = llm.manager.block_pool  # type: ignore[attr-defined]
            pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))

        engine.call(evict).result(30)
        code, _, again = post(live.url, "/v1/completions", body)
        assert code == 200
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 40
        m = metrics(live.url)
        cpu = (("medium", "CPU"),)
        assert m[("hybridkv:kv_tier_hit_tokens_total", cpu)] == 40
        assert m[("hybridkv:kv_tier_loads_total", cpu)] > 0
        assert m[("hybridkv:kv_tier_stores_total", cpu)] > 0
        assert m[("hybridkv:kv_tier_used_bytes", cpu)] > 0
        assert m[("hybridkv:kv_tier_hits_total", (("medium", "DISK"),))] == 0
    finally:
        live.stop()
    assert list(disk.glob("*/*.unit")), "the cache was not written to disk at shutdown"
