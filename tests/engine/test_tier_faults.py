"""The tiers under ``LLM`` when the disk misbehaves: serving goes on, nothing
wrong is ever a hit (Gemma 3: sliding + full attention).

- **disk full**: a real 64 KiB tmpfs under a disk tier whose budget says 4 MiB
  (root mounts it; elsewhere a byte quota on the entry writes raises
  ``ENOSPC``): the stores that do not fit are skipped with one warning and
  counted, no temporary file is left, the tokens stay right, and a restart
  serves only the entries that were written whole;
- **an entry cut short**: an engine process killed in the middle of writing
  its cache at ``close`` leaves a temporary file; the restarted engine removes
  it, adopts only the entries renamed into place, and its tokens stay right;
- **another model's entries** (other weights, dtype, block size or kernel
  backend) in the same ``disk_cache_dir`` are never a hit, and the first
  model's entries survive them;
- **a folder that cannot be written** (a read-only filesystem as root, else a
  mode without write, else an injected ``EACCES``): ``hybridkv serve`` prints one
  line naming ``disk_cache_dir`` and exits 2.

- **a flipped byte** in a disk entry's payload: a miss, the entry removed, and
  counted in ``/metrics`` (``test_tier_engine.py`` checks the tokens; entry by
  entry, ``tests/tiers/test_disk_tier_faults.py``).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from oracle import random_prompt
from tier_runs import ColdEngine, evict_device, tier_hit, tiered_llm
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.specs import FullAttentionSpec
from hybridkv.tiers import entry_file

DOCS = [random_prompt(96, 41 + i) for i in range(3)]
MAX_LEN = 112
HOST_GIB = 48 * 2048 / (1 << 30)  # about one document's units: the rest spills to disk


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def cold(ckpt: Path) -> ColdEngine:
    return ColdEngine(ckpt, max_model_len=MAX_LEN)


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[bool]:
    """Mount a tmpfs at ``path`` with ``options`` (root only); yields whether it is."""
    path.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if os.geteuid() != 0 or mount is None:
        yield False
        return
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, check=False
    )
    if done.returncode:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@pytest.fixture
def full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on a 64 KiB disk: a tmpfs, or a byte quota on entry writes."""
    folder = tmp_path / "small"
    with tmpfs(folder, "size=64k,mode=0700") as mounted:
        if not mounted:
            left = {"bytes": 64 << 10}
            real = entry_file.write_all

            def quota(fd: int, data: memoryview | bytes) -> None:
                n = memoryview(data).nbytes
                if n > left["bytes"]:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                left["bytes"] -= n
                real(fd, data)

            monkeypatch.setattr(entry_file, "write_all", quota)
        yield folder


def test_a_full_disk_skips_stores_with_one_warning_and_serving_goes_on(
    ckpt: Path, cold: ColdEngine, full_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    llm = tiered_llm(ckpt, full_disk, "lru", max_model_len=MAX_LEN, kv_offloading_size=HOST_GIB)
    assert llm.tiers is not None and llm.tiers.disk is not None
    disk = llm.tiers.disk
    with caplog.at_level(logging.WARNING, "hybridkv"):
        for doc in DOCS:  # each evicts the one before from the host tier to disk
            tier_hit(ckpt, llm, doc, "CPU", cold=cold)
            evict_device(llm)
        tier_hit(ckpt, llm, [*DOCS[-1], 5], "CPU", cold=cold)  # serving goes on
        llm.close()  # writes the rest: the disk is full
    disk_warnings = [r.getMessage() for r in caplog.records if "DISK" in r.getMessage()]
    assert len(disk_warnings) == 1 and "disk full" in disk_warnings[0], disk_warnings
    assert disk.stats.store_skips > 0 and disk.stats.stores > 0  # some fit, some did not
    assert disk.stats.store_failures == 0
    assert not list(full_disk.rglob("*.tmp"))
    written = set(disk.keys())

    again = tiered_llm(ckpt, full_disk, "lru", max_model_len=MAX_LEN)  # only whole entries
    assert again.tiers is not None and again.tiers.disk is not None
    assert set(again.tiers.disk.keys()) == written
    for doc in DOCS:
        tier_hit(ckpt, again, [*doc, 5], "DISK", cold=cold)
        evict_device(again)
    assert again.tiers.stats.load_failures == 0
    again.close()


def test_a_flipped_byte_is_counted_in_metrics(ckpt: Path, cold: ColdEngine, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from hybridkv.serving.metrics import ServerMetrics

    llm = tiered_llm(ckpt, tmp_path, "lru", max_model_len=MAX_LEN)
    tier_hit(ckpt, llm, DOCS[0], "CPU", cold=cold)
    llm.close()
    entries = sorted(tmp_path.rglob("*.unit"))
    groups = llm.kv_cache_config.kv_cache_groups
    full = next(g for g, gr in enumerate(groups) if type(gr.kv_cache_spec) is FullAttentionSpec)
    flipped = next(p for p in entries if p.name.startswith(f"g{full}-"))  # every hit reads it
    raw = bytearray(flipped.read_bytes())
    raw[-1] ^= 0x01  # the payload's last byte: the header still reads fine
    flipped.write_bytes(bytes(raw))
    again = tiered_llm(ckpt, tmp_path, "lru", max_model_len=MAX_LEN)
    assert again.tiers is not None and again.tiers.disk is not None
    assert len(again.tiers.disk.keys()) == len(entries)  # found only when loaded
    hit = cold.check(again, [*DOCS[0], 5], 2)  # the same tokens, whatever the hit
    assert hit < 96 and again.tiers.stats.load_failures == 1  # a miss from there on
    assert not flipped.exists() and again.tiers.disk.stats.corrupt_removed == 1
    metrics = ServerMetrics("m")
    metrics.refresh(again)
    line = 'hybridkv:kv_tier_corrupt_entries_removed_total{medium="DISK",model_name="m"} 1.0'
    assert line in metrics.render().decode().splitlines()
    again.close()


KILLED_ENGINE = """
import os, sys
from hybridkv.engine import LLM, SamplingParams

ckpt, folder, renames = sys.argv[1], sys.argv[2], int(sys.argv[3])
doc = [int(t) for t in sys.argv[4].split(",")]
llm = LLM(ckpt, block_size=8, max_model_len=112, kv_offloading_size=0.004,
          disk_cache_dir=folder, disk_cache_size=0.004)
llm.generate([{"prompt_token_ids": doc}], SamplingParams(max_tokens=2), use_tqdm=False)
real, left = os.replace, [renames]

def replace(src, dst):  # killed after the bytes of the next entry, before its rename
    if not left[0]:
        os._exit(9)
    left[0] -= 1
    real(src, dst)

os.replace = replace
llm.close()
"""


def test_an_engine_killed_while_writing_its_cache_serves_only_whole_entries(
    ckpt: Path, cold: ColdEngine, tmp_path: Path
) -> None:
    renames = 20  # of the document's 48 units
    args = [str(ckpt), str(tmp_path), str(renames), ",".join(map(str, DOCS[0]))]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_ENGINE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 9, done.stderr[-2000:]
    assert len(list(tmp_path.rglob("*.tmp"))) == 1  # the entry cut short

    again = tiered_llm(ckpt, tmp_path, "lru", max_model_len=MAX_LEN)
    assert again.tiers is not None and again.tiers.disk is not None
    disk = again.tiers.disk
    assert disk.stats.leftovers_removed == 1 and not list(tmp_path.rglob("*.tmp"))
    assert len(disk.keys()) == renames
    tier_hit(ckpt, again, [*DOCS[0], 5], "DISK", cold=cold)  # whatever whole hit they give
    assert again.tiers.stats.load_failures == 0 and disk.stats.corrupt_removed == 0
    again.close()


#: Another model in the same folder: what differs from the first engine.
OTHERS = {
    "weights": {},  # the same config, other random weights
    "dtype": {"dtype": "bfloat16"},
    "block size": {"block_size": 4},
    "kernel backend": {"kernel_backend": "torch", "device": "cpu"},
}


@pytest.mark.parametrize("other", sorted(OTHERS))
def test_another_models_entries_in_the_folder_are_never_a_hit(
    ckpt: Path, cold: ColdEngine, tmp_path: Path, other: str
) -> None:
    folder, prompt = tmp_path / "kv", [*DOCS[0], 5]
    mine = tiered_llm(ckpt, folder, "lru", max_model_len=MAX_LEN)
    tier_hit(ckpt, mine, DOCS[0], "CPU", cold=cold)
    mine.close()  # the document's units on disk

    theirs_ckpt = ckpt
    if other == "weights":
        theirs_ckpt = save_checkpoint(gemma3_config(), tmp_path / "other", seed=1)
    theirs = tiered_llm(theirs_ckpt, folder, "lru", max_model_len=MAX_LEN, **OTHERS[other])
    assert theirs.tiers is not None and theirs.tiers.disk is not None
    assert theirs.tiers.disk.keys() == []
    ref = ColdEngine(theirs_ckpt, max_model_len=MAX_LEN, **OTHERS[other])
    assert tier_hit(theirs_ckpt, theirs, prompt, "DISK", cold=ref) == 0
    assert theirs.tiers.stats.loads_disk == 0
    theirs.close()

    again = tiered_llm(ckpt, folder, "lru", max_model_len=MAX_LEN)  # the first model's survive
    assert tier_hit(ckpt, again, prompt, "DISK", cold=cold) > 0
    again.close()


@pytest.mark.parametrize("how", ["read-only", "a file in the way"])
def test_serve_refuses_a_disk_dir_it_cannot_write(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    pytest.importorskip("fastapi")
    from hybridkv.cli import main
    from hybridkv.tiers import disk_dir

    folder = tmp_path / "kv"
    argv = ["serve", "--port=0", str(tmp_path / "model"), "--kv-offloading-size", "1"]
    argv += ["--disk-cache-dir", str(folder), "--disk-cache-size", "1"]
    with tmpfs(folder, "size=64k,ro") as mounted:
        if how == "a file in the way":
            (tmp_path / "a-file").write_text("")
            argv[-3] = str(tmp_path / "a-file" / "kv")
        elif not mounted and os.geteuid() != 0:
            folder.chmod(0o500)
        elif not mounted:  # root without mount: the write probe is refused

            def denied(path: Path) -> None:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

            monkeypatch.setattr(disk_dir, "_probe_write", denied)
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "disk_cache_dir" in err[0] and "not a writable" in err[0], err
