"""The tiers under ``LLM`` on one family (Gemma 3: sliding + full attention).

A device pool too small to keep two documents makes the second one's
allocation evict the first into the host tier; a flipped byte in a disk entry
is a miss (recomputed, same tokens); a salted request never hits another
salt's entries; the tier options are checked (one line, exit 2 for serve).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import random_prompt
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams

MAX_LEN = 112
GIB = 0.002
DOC, OTHER = random_prompt(100, 21), random_prompt(100, 22)
SP = SamplingParams(max_tokens=2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def cold(ckpt: Path) -> LLM:
    return LLM(ckpt, block_size=4, max_model_len=MAX_LEN, device="cpu", kernel_backend="native")


def _gen(llm: LLM, prompt: list[int], salt: str | None = None) -> tuple[list[int], int]:
    p: dict[str, object] = {"prompt_token_ids": prompt}
    if salt is not None:
        p["cache_salt"] = salt
    out = llm.generate([p], SP, use_tqdm=False)[0]  # type: ignore[list-item]
    llm.manager.check_integrity()
    assert llm.tiers is not None
    llm.tiers.check_integrity()
    return list(out.outputs[0].token_ids), int(out.num_cached_tokens)


def _tiered(ckpt: Path, cold: LLM, disk: Path | None = None, **kw: object) -> LLM:
    """An engine whose pool holds one request and a little more."""
    extra: dict[str, object] = {}
    if disk is not None:
        extra = {"disk_cache_dir": str(disk), "disk_cache_size": GIB}
    memory = cold.plan.min_memory_bytes + 2 * cold.plan.page_bytes
    kw = {"device": "cpu", "kernel_backend": "native", **kw}  # the cold engine's, by default
    return LLM(
        ckpt,
        block_size=4,
        max_model_len=MAX_LEN,
        kv_cache_memory_bytes=memory,
        kv_offloading_size=GIB,
        **extra,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def _want(cold: LLM, prompt: list[int]) -> list[int]:
    """The tokens of an engine without tiers."""
    out = cold.generate([{"prompt_token_ids": prompt}], SP, use_tqdm=False)[0]
    return list(out.outputs[0].token_ids)


@pytest.mark.parametrize(
    ("policy", "backend"), [("lru", "native"), ("hybrid", "native"), ("lru", "torch")]
)
def test_the_pool_evicts_into_the_host_tier(
    ckpt: Path, cold: LLM, policy: str, backend: str
) -> None:
    llm = _tiered(ckpt, cold, cache_policy=policy, kernel_backend=backend)
    assert llm.tiers is not None
    _gen(llm, DOC)
    _gen(llm, OTHER)  # its allocation reuses the first document's blocks
    stats = llm.tiers.stats
    if policy == "lru":  # written through as computed (vLLM's way), nothing demoted
        assert stats.written_through > 0 and stats.demoted == 0
    else:  # demoted as the pool reused them, nothing written through
        assert stats.demoted > 0 and stats.written_through == 0
    tokens, hit = _gen(llm, [*DOC, 7, 8])
    ref = cold
    if backend != "native":
        ref = LLM(ckpt, block_size=4, max_model_len=MAX_LEN, device="cpu", kernel_backend=backend)
    assert tokens == _want(ref, [*DOC, 7, 8])
    # The tier gave what the device lost (under hybrid the pool may keep a block or two).
    assert 0 < llm.tiers.stats.hit_tokens <= hit
    assert llm.tiers.stats.hit_tokens == hit or policy == "hybrid"
    _check_metrics(llm)
    llm.close()


def _check_metrics(llm: LLM) -> None:
    """``/metrics``' tier series read the engine's counts (added once per refresh)."""
    pytest.importorskip("prometheus_client")
    from hybridkv.serving.metrics import ServerMetrics

    assert llm.tiers is not None
    stats = llm.tiers.stats
    metrics = ServerMetrics("m")
    for _ in range(2):  # a second refresh adds nothing
        metrics.refresh(llm)
    text = metrics.render().decode()

    def value(series: str, medium: str) -> float:
        key = f'hybridkv:{series}{{medium="{medium}",model_name="m"}} '
        line = next(ln for ln in text.splitlines() if ln.startswith(key))
        return float(line.split()[-1])

    assert value("kv_tier_loads_total", "CPU") == stats.loads_cpu > 0
    assert value("kv_tier_hit_tokens_total", "CPU") == stats.hit_tokens
    assert value("kv_tier_stores_total", "CPU") == llm.tiers.host.stats.stores > 0
    assert value("kv_tier_used_bytes", "CPU") == llm.tiers.host.used_bytes
    assert value("kv_tier_loads_total", "DISK") == 0
    assert (
        f'hybridkv:kv_tier_load_seconds_count{{model_name="m"}} {len(stats.load_seconds)}' in text
    )
    assert f'hybridkv:kv_tier_swaps_total{{model_name="m"}} {float(stats.swaps)}' in text
    wait = next(
        ln for ln in text.splitlines() if ln.startswith("hybridkv:kv_tier_load_wait_seconds_total")
    )
    assert float(wait.split()[-1]) == pytest.approx(stats.load_wait_seconds)


def test_a_flipped_byte_on_disk_is_a_miss(ckpt: Path, cold: LLM, tmp_path: Path) -> None:
    llm = _tiered(ckpt, cold, tmp_path)
    _gen(llm, DOC)
    assert llm.tiers is not None and llm.tiers.disk is not None
    folder = llm.tiers.disk.folder
    llm.close()  # the device's cache is written to disk
    entries = sorted(folder.glob("*.unit"))
    assert entries
    for path in entries:  # the payload's last byte: the header still reads fine
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    again = _tiered(ckpt, cold, tmp_path)
    assert again.tiers is not None and again.tiers.disk is not None
    tokens, hit = _gen(again, [*DOC, 7, 8])
    assert tokens == _want(cold, [*DOC, 7, 8])
    assert hit == 0  # every load failed: recomputed, nothing stale read
    failed = again.tiers.stats.load_failures
    assert failed > 0 and again.tiers.disk.stats.corrupt_removed == failed
    again.close()


def test_a_salted_request_never_hits_another_salts_entries(ckpt: Path, cold: LLM) -> None:
    llm = _tiered(ckpt, cold)
    assert llm.tiers is not None
    _gen(llm, DOC, salt="alice")
    _gen(llm, OTHER, salt="alice")  # the first document goes to the host tier
    loads = llm.tiers.stats.loads_cpu
    for salt in ("bob", None):
        _, hit = _gen(llm, [*DOC, 7, 8], salt=salt)
        assert hit == 0 and llm.tiers.stats.loads_cpu == loads
    _, hit = _gen(llm, [*DOC, 7, 8], salt="alice")
    assert hit > 0 and llm.tiers.stats.loads_cpu > loads
    llm.close()


def test_tier_options_are_checked_before_the_checkpoint(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    afile = tmp_path / "a-file"
    afile.write_text("")
    bad = [
        ({"disk_cache_dir": str(tmp_path), "disk_cache_size": 1}, "needs kv_offloading_size"),
        ({"kv_offloading_size": 0}, "kv_offloading_size must be"),
        ({"kv_offloading_size": 1, "kv_offloading_backend": "lmcache"}, "must be 'native'"),
        ({"kv_offloading_size": 1, "hash_algo": "xxhash"}, "hash_algo='sha256'"),
        ({"kv_offloading_size": 1, "enable_prefix_caching": False}, "enable_prefix_caching"),
        ({"kv_offloading_size": 1, "disk_cache_dir": str(tmp_path)}, "go together"),
        (
            {"kv_offloading_size": 1, "disk_cache_dir": str(afile / "d"), "disk_cache_size": 1},
            "disk_cache_dir",
        ),
    ]
    for kw, words in bad:
        with pytest.raises(ValueError, match=words):
            LLM(missing, **kw)  # type: ignore[arg-type]


def test_serve_refuses_an_unwritable_disk_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("fastapi")
    from hybridkv.cli import main

    afile = tmp_path / "a-file"
    afile.write_text("")
    argv = ["serve", "--port=0", str(tmp_path / "model"), "--kv-offloading-size", "1"]
    argv += ["--disk-cache-dir", str(afile / "cache"), "--disk-cache-size", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "disk_cache_dir" in err[0], err


def test_a_failed_step_leaves_nothing_for_the_tiers(
    ckpt: Path, cold: LLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks are cached when allocated, before their step computes them: an aborted
    call must take them out of the cache, or the disk tier would keep them."""
    llm = _tiered(ckpt, cold, tmp_path)

    def boom(work: object) -> None:
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(llm.runner, "execute", boom)
    with pytest.raises(RuntimeError, match="exploded"):
        llm.generate([{"prompt_token_ids": DOC}], SP, use_tqdm=False)
    assert llm.manager.block_pool.num_cached_blocks() == 0
    assert llm.tiers is not None and llm.tiers.disk is not None
    folder = llm.tiers.disk.folder
    llm.close()
    assert not list(folder.glob("*.unit"))


def test_a_host_tier_sizes_the_seen_prompt_memory_for_device_and_host(
    ckpt: Path, cold: LLM
) -> None:
    """Under ``hybrid`` the memory of seen prompts covers device and host together
    (``offload.hybrid_with_tiers``, as the simulator's); under ``lru`` nothing changes."""
    from hybridkv.offload import hybrid_with_tiers

    def seen(llm: LLM) -> int:
        memory = llm.manager.policy.seen  # type: ignore[attr-defined]
        assert memory is not None
        return int(memory.capacity)

    device = LLM(ckpt, block_size=4, max_model_len=MAX_LEN, cache_policy="hybrid")
    tiered = _tiered(ckpt, cold, cache_policy="hybrid")
    assert tiered.tiers is not None
    ratio = (tiered.plan.available_memory_bytes + tiered.tiers.host.budget_bytes) / (
        tiered.plan.available_memory_bytes
    )
    per_block = seen(tiered) / tiered.manager.block_pool.num_blocks
    base = seen(device) / device.manager.block_pool.num_blocks
    assert per_block == pytest.approx(base * ratio, rel=0.05) and ratio > 2
    assert hybrid_with_tiers(tiered.cache_config, 1) is not None
    lru = _tiered(ckpt, cold)
    assert hybrid_with_tiers(lru.cache_config, 1) is None  # lru: no hybrid options
    tiered.close()
    lru.close()
