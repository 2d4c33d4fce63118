"""``ModelFingerprint``: every field changes the digest; the digest is stable across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tier_factories import config, fingerprint

from hybridkv.tiers import ModelFingerprint

HERE = Path(__file__).resolve().parent


def test_each_field_changes_the_digest() -> None:
    base = fingerprint()
    variants = [
        fingerprint(weights="ckpt-b"),
        fingerprint(dtype="float16"),
        fingerprint(block_size=32),
        fingerprint(layout="hybridkv-unit/v2"),
        ModelFingerprint.from_kv_cache_config(config(window=64), "ckpt-a"),  # another grouping
        replace(base, groups=base.groups[:2]),
    ]
    digests = {v.digest for v in variants} | {base.digest}
    assert len(digests) == len(variants) + 1
    assert fingerprint().digest == base.digest and len(base.digest) == 32


def test_from_config_names_dtypes_and_groups() -> None:
    fp = fingerprint(dtype="float16")
    assert fp.dtypes == ("float16", "float32") and fp.block_size == 16
    assert len(fp.groups) == 3 and '"sliding_window":32' in fp.groups[1]
    # dtypes are a set: their order does not matter
    assert replace(fp, dtypes=("float32", "float16", "float16")).digest == fp.digest


def test_digest_is_stable_across_processes() -> None:
    code = "from tier_factories import fingerprint; print(fingerprint().hex)"
    outs = set()
    for seed in ("0", "1234"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(HERE)}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(done.stdout.strip())
    assert outs == {fingerprint().hex}


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("weights", "", "weights must be a non-empty string"),
        ("layout", "", "layout must be a non-empty string"),
        ("block_size", 0, "block_size must be a positive integer"),
        ("groups", (), "at least one KV cache group"),
    ],
)
def test_bad_fields_name_themselves(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(fingerprint(), **{field: value})
