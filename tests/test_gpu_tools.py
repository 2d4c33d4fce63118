"""``tools/gpu``: the carry packer's split and the device session's stage runner, on the CPU."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "tools" / "gpu" / "session.sh"


def _prepare():
    spec = importlib.util.spec_from_file_location("gpu_prepare", ROOT / "tools/gpu/prepare.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_split_parts_join_back_to_the_file_with_its_digest(tmp_path):
    data = os.urandom(2500)
    src = tmp_path / "model.gguf"
    src.write_bytes(data)
    dest = tmp_path / "carry"
    (dest / "gguf-9").mkdir(parents=True)  # a stale part from an earlier run goes
    parts = _prepare().split_file(src, dest, 1000)
    assert [p.parent.name for p in parts] == ["gguf-1", "gguf-2", "gguf-3"]
    assert [p.stat().st_size for p in parts] == [1000, 1000, 500]
    assert not (dest / "gguf-9").exists()
    assert b"".join(p.read_bytes() for p in parts) == data
    digest, name = (dest / "gguf-1" / "SHA256").read_text().split()
    assert (digest, name) == (hashlib.sha256(data).hexdigest(), "model.gguf")


def _session(tmp_path, *stages):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable}
    return subprocess.run(
        ["bash", str(SESSION), *stages], capture_output=True, text=True, env=env, timeout=60
    )


def test_session_runs_stages_logs_them_and_refuses_unknown_ones(tmp_path):
    run = _session(tmp_path, "noop")
    assert run.returncode == 0, run.stderr
    log = (tmp_path / "out" / "noop.txt").read_text()
    assert log.startswith("== noop\n") and "== noop: exit 0 in" in log
    (tmp_path / "out" / "noop.txt").unlink()
    bad = _session(tmp_path, "noop", "fly")
    assert bad.returncode == 2 and "unknown stage: fly" in bad.stderr
    assert not (tmp_path / "out" / "noop.txt").exists()  # checked before any stage runs


def test_triton_cache_stage_packs_the_cache_into_parts_that_unpack_to_it(tmp_path):
    cache = tmp_path / "cache"
    (cache / "ab12").mkdir(parents=True)
    blob = os.urandom(4000)
    (cache / "ab12" / "kernel.cubin").write_bytes(blob)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable}
    env["TRITON_CACHE_DIR"] = str(cache)
    run = subprocess.run(
        ["bash", str(SESSION), "triton-cache"], capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    parts = sorted((tmp_path / "out").glob("triton-cache.tar.gz.part-*"))
    assert [p.name for p in parts] == ["triton-cache.tar.gz.part-00"]
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["tar", "xzf", str(parts[0]), "-C", str(back)], check=True)
    assert (back / "ab12" / "kernel.cubin").read_bytes() == blob


def test_mamba_ssm_stage_says_when_mamba_ssm_was_not_carried(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable}
    env["MAMBA_SITE"] = str(tmp_path / "no-site")
    run = subprocess.run(
        ["bash", str(SESSION), "mamba-ssm-tests"], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert run.returncode == 1
    log = (tmp_path / "out" / "mamba-ssm-tests.txt").read_text()
    assert "mamba-ssm not carried (.gpu-carry/mamba)" in log


def test_more_than_eight_result_files_come_back_as_one_archive(tmp_path):
    # The device tool returns at most 8 files from $OUT; the third lease lost its Mamba
    # sweep's table to that limit.
    out = tmp_path / "out"
    out.mkdir()
    for i in range(8):
        (out / f"r{i}.md").write_text(f"result {i}\n")
    run = _session(tmp_path, "noop")  # + noop.txt: 9 files
    assert run.returncode == 0, run.stderr
    assert [p.name for p in out.iterdir()] == ["out.tar.gz"]
    with tarfile.open(out / "out.tar.gz") as tar:
        names = {n.lstrip("./") for n in tar.getnames()} - {""}
        assert {f"r{i}.md" for i in range(8)} | {"noop.txt"} <= names
        assert tar.extractfile("./r3.md").read() == b"result 3\n"


def test_eight_result_files_or_fewer_come_back_as_they_are(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.md").write_text("x\n")
    assert _session(tmp_path, "noop").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["noop.txt", "r.md"]
