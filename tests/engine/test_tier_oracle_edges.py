"""Tier hits at the edges of what a hit reads, token-identical to transformers.

A tier hit of ``L`` tokens restores, per group, only the blocks a query at
``L`` reads (``first_needed_block``): one block too few there is garbage read
as context, so the edges are where an off-by-one would show. With 8-token
blocks:

- **window edge** (Gemma 3: sliding + full; Mistral: every layer sliding),
  window 17: the query at ``L`` reads from ``L - 16``, the first token of a
  block, at every ``L`` (a multiple of 8): the hit needs exactly two sliding
  blocks, from the first token read. Prompts of 17 (the window reaches token 0
  exactly), 25 and 96 tokens (a prompt ending on a block: its last block is
  recomputed), 97 (past it).
- **chunk boundary** (Llama 4), chunk 12: a hit at 48 ends on a chunk
  boundary (the chunked groups need none of their blocks), a prompt of 48
  tokens ends on one (its hit at 40 reads the chunk from 36, mid-block), and a
  hit at 56 reads the chunk from 48, a block's first token.

A document is computed once; each prompt (a prefix of it) then runs on an
emptied device (``tier_runs.evict_device``), hitting from the host tier; after
a restart, from the disk tier alone (``drop_host``). Both policies on the
native backend, and one policy each on the Triton interpreter (tiny shapes:
every kernel interpreted on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from oracle import device_for, random_prompt
from tier_runs import BLOCK, drop_host, evict_device, tier_hit, tiered_llm
from tiny_checkpoints import gemma3_config, llama4_config, mistral_config, save_checkpoint

WINDOW, CHUNK = 2 * BLOCK + 1, 12
DOC = random_prompt(100, 31)
MAX_LEN = 112

#: case -> (config, the prompt lengths probed and the hit each must get)
CASES: dict[str, tuple[Callable[[], Any], dict[int, int]]] = {
    "gemma3-window-edge": (
        lambda: gemma3_config(sliding_window=WINDOW),
        {17: 16, 25: 24, 96: 88, 97: 96},
    ),
    "mistral-window-edge": (
        lambda: mistral_config(sliding_window=WINDOW),
        {17: 16, 25: 24, 96: 88, 97: 96},
    ),
    "llama4-chunk-boundary": (
        lambda: llama4_config(attention_chunk_size=CHUNK),
        {49: 48, 48: 40, 57: 56},
    ),
}
#: The Triton interpreter's runs (slow: one policy, a short document, few prompts).
TRITON = {
    "gemma3-window-edge": ("lru", (25,)),
    "llama4-chunk-boundary": ("hybrid", (49, 57)),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    name: str = request.param
    config, probes = CASES[name]
    return name, save_checkpoint(config(), tmp_path_factory.mktemp(name)), probes


def _host_then_disk(
    ckpt: Path, disk: Path, policy: str, probes: dict[int, int], **kw: object
) -> None:
    """The document (as long as the longest probe needs), then each probe from the
    host tier; after a restart, each from the disk tier."""
    llm = tiered_llm(ckpt, disk, policy, max_model_len=MAX_LEN, **kw)
    assert tier_hit(ckpt, llm, DOC[: max(probes) + 1], "CPU") == 0
    for length, want in probes.items():
        evict_device(llm)
        assert tier_hit(ckpt, llm, DOC[:length], "CPU") == want, length
    llm.close()
    again = tiered_llm(ckpt, disk, policy, max_model_len=MAX_LEN, **kw)  # a restart
    for length, want in probes.items():
        evict_device(again)
        drop_host(again)
        assert tier_hit(ckpt, again, DOC[:length], "DISK") == want, length
    again.close()


def test_the_cases_are_on_their_edges() -> None:
    for name, (_, probes) in CASES.items():
        hits = list(probes.values())
        assert all(hit % BLOCK == 0 for hit in hits), name
        if "window" in name:  # the first token read (none skipped below the window) ...
            starts = [max(0, hit - WINDOW + 1) for hit in hits]
            assert all(s % BLOCK == 0 for s in starts), name  # ... is a block's first
    chunk_start = {hit: hit // CHUNK * CHUNK for hit in CASES["llama4-chunk-boundary"][1].values()}
    assert chunk_start[48] == 48  # a hit on a chunk boundary
    assert chunk_start[40] % BLOCK and chunk_start[56] % BLOCK == 0  # mid-block; a block's start
    assert 48 % CHUNK == 0 and 48 in CASES["llama4-chunk-boundary"][1]  # a prompt ending on one


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_edge_hits_from_host_then_disk_match_transformers(
    case: tuple, tmp_path: Path, policy: str
) -> None:
    _, ckpt, probes = case
    _host_then_disk(ckpt, tmp_path / "disk", policy, probes)


@pytest.mark.parametrize("case", list(TRITON), indirect=True)
def test_edge_hits_on_the_triton_interpreter(case: tuple, tmp_path: Path) -> None:
    name, ckpt, probes = case
    policy, lengths = TRITON[name]
    backend = {"kernel_backend": "triton", "device": device_for("triton")}
    _host_then_disk(ckpt, tmp_path / "disk", policy, {n: probes[n] for n in lengths}, **backend)
