"""Mamba states restored from a tier at every kind of kept point, token-identical
to transformers.

A Mamba group's hit at ``L`` needs the state at ``L`` (one block of its own),
and the runner writes a state only where the policy keeps one. Under ``lru``
every block boundary keeps its state; under ``hybrid`` only the kept points
(``hybridkv.policy.retention``) do, and only their units are demoted:

- ``floor``: the snapshot floor (``floor_tokens`` = 3 pages here);
- ``tail``: a boundary in the tail before a freed request's end
  (``tail_tokens`` = 2 pages);
- ``prompt``: the prompt's end, aligned down (``P``);
- ``end``: the end of what the request computed, past its prompt (``E``);
- ``branch``: where a request left a cached prefix (``F``);
- ``hit``: the hit a request was admitted with (``H``).

With ``s`` tokens per page (32 for Jamba's Mamba1, 48 for Bamba's Mamba2), a
document of ``6s - 1`` tokens and one decode put the floor at ``3s``, a
tail-only point at ``4s``, ``P`` at ``5s`` and ``E`` at ``6s``; a request
leaving the document at ``2.5s`` branches at ``2s``, and the next request
hitting ``2s`` keeps it as its hit. Each point is probed by a prompt that
leaves the cached tokens right after it, on an emptied device (the hit must be
exactly the point, all of it loaded from the host tier, which held nothing at
that point before the request that keeps it), then after a restart from the
disk tier alone. Under ``hybrid`` a boundary nobody keeps (``s``) is
no hit: the points are the policy's, not every boundary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import check_against_hf, device_for, random_prompt, shared_block_size
from tier_runs import drop_host, evict_device, tier_hit, tiered_llm
from tiny_checkpoints import bamba_config, jamba_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.policy import HybridOptions

FAMILIES = {"jamba": jamba_config, "bamba": bamba_config}
FRESH = random_prompt(40, 99)  # never cached before a probe


@pytest.fixture(scope="module", params=list(FAMILIES))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(FAMILIES[request.param](), tmp_path_factory.mktemp(request.param))


def _engine(ckpt: Path, disk: Path, policy: str, s: int, **kw: object) -> LLM:
    if policy == "hybrid":  # a short tail and a floor inside the document
        kw["hybrid"] = HybridOptions(tail_tokens=2 * s, floor_tokens=3 * s)
    return tiered_llm(ckpt, disk, policy, max_model_len=7 * s, **kw)


def _probe(
    ckpt: Path, llm: LLM, tokens: list[int], point: int, medium: str, redemote: bool = False
) -> int:
    """The hit of a prompt that leaves ``tokens`` right after ``point``, on an
    emptied device. ``redemote``: the host's copies of what the device holds are
    dropped first, so the device's own demotion decides whether the host has them."""
    if redemote:
        drop_host(llm, on_device=True)
    evict_device(llm)
    if medium == "DISK":
        drop_host(llm)
    return tier_hit(ckpt, llm, [*tokens[:point], *FRESH[:5]], medium)


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_every_kind_of_kept_point_from_host_then_disk(
    ckpt: Path, tmp_path: Path, policy: str
) -> None:
    s = shared_block_size(LLM(ckpt, block_size=8))
    llm = _engine(ckpt, tmp_path / "disk", policy, s)
    doc = random_prompt(6 * s - 1, 7)
    out = check_against_hf(ckpt, llm, [doc], 2)[0].outputs[0].token_ids
    computed = [*doc, out[0]]  # 6s tokens: the decode step computed the first output
    kinds = {"floor": 3 * s, "tail": 4 * s, "prompt": 5 * s, "end": 6 * s}
    # A boundary no kept point is on: a hit from the tier under lru only.
    assert _probe(ckpt, llm, doc, s, "CPU") == (s if policy == "lru" else 0)
    for kind, point in kinds.items():
        assert _probe(ckpt, llm, computed, point, "CPU") == point, kind
    evict_device(llm)
    check_against_hf(ckpt, llm, [[*doc[: 5 * s // 2], *FRESH[10:20]]], 2)  # branches at 2s
    kinds["branch"] = 2 * s
    assert _probe(ckpt, llm, doc, 2 * s, "CPU") == 2 * s, "branch"
    # The probe just run was admitted with a hit at 2s, its H: under hybrid the
    # device's units are demoted again (the branch's copies in the host tier are
    # dropped first); lru wrote them through when computed (nothing to redemote).
    kinds["hit"] = 2 * s
    again_demoted = policy == "hybrid"
    assert _probe(ckpt, llm, doc, 2 * s, "CPU", redemote=again_demoted) == 2 * s, "hit"
    llm.close()

    again = _engine(ckpt, tmp_path / "disk", policy, s)  # a restart: only the disk survives
    for kind, point in kinds.items():
        assert _probe(ckpt, again, computed, point, "DISK") == point, kind
    again.close()


def test_kept_points_on_the_triton_interpreter(tmp_path: Path) -> None:
    """Jamba under ``hybrid`` on the Triton interpreter (slow: one short document):
    the state at its prompt's end, from the host tier, then from disk."""
    ckpt = save_checkpoint(jamba_config(), tmp_path / "jamba")
    backend = {"kernel_backend": "triton", "device": device_for("triton")}
    s = shared_block_size(LLM(ckpt, block_size=8))
    llm = _engine(ckpt, tmp_path / "disk", "hybrid", s, **backend)
    doc = random_prompt(s + 1, 8)
    check_against_hf(ckpt, llm, [doc], 2)
    assert _probe(ckpt, llm, doc, s, "CPU") == s
    llm.close()
    again = _engine(ckpt, tmp_path / "disk", "hybrid", s, **backend)
    assert _probe(ckpt, again, doc, s, "DISK") == s
    again.close()
