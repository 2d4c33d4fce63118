"""Merged projections (``models/layers/merged_linear.py``): one GEMM for q/k/v and gate/up.

In fp32 on the CPU the merged products are bit-identical to the separate ones (the
default ``merge_projections=True`` rests on it), so the engine's logits are equal,
not close, with and without the merge, on every backend the CPU runs, in every family
(the tiny checkpoints of ``tiny_checkpoints.FAMILY_CONFIGS``); and the merged engine
still matches transformers (each family's ``test_<family>_oracle.py`` runs merged, the
default).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from oracle import device_for, random_prompt, run_engine
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint
from torch import nn

from hybridkv.engine import LLM
from hybridkv.models.layers.merged_linear import MergeableProjections, merge_projections

#: families with no separate gate/up: Granite 4.0 H's shared MLP is one ``input_linear``
#: in the checkpoint already, and its routed experts are stacked tensors.
_NO_GATE_UP = {"granite"}
_PARTS = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """``family -> checkpoint path``, each saved once for the module."""
    saved: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in saved:
            path = tmp_path_factory.mktemp(family)
            saved[family] = save_checkpoint(FAMILY_CONFIGS[family](), path)
        return saved[family]

    return get


#: Every family on the torch backend; the triton (interpreted: slow) and native
#: backends on one attention-only family and one with Mamba and routed experts each:
#: the merge is in the model's linear layers, which every backend runs the same way.
_CASES = [(f, "torch") for f in sorted(FAMILY_CONFIGS)] + [
    ("gemma3", "triton"),
    ("gemma3", "native"),
    ("jamba", "triton"),
    ("llama4", "native"),
]


@pytest.mark.parametrize(("family", "backend"), _CASES)
def test_merged_and_separate_projections_give_equal_logits(ckpts, family, backend):
    prompts = [random_prompt(9, 1), random_prompt(14, 2)]
    runs = []
    for merge in (True, False):
        llm = LLM(ckpts(family), block_size=4, kernel_backend=backend,
                  device=device_for(backend), merge_projections=merge)  # fmt: skip
        names = {n for n, _ in llm.model.named_parameters()}
        assert any(n.endswith(".qkv_proj.weight") for n in names) is merge
        has_gate_up = any(n.endswith(".gate_up_proj.weight") for n in names)
        assert has_gate_up is (merge and family not in _NO_GATE_UP)
        assert any(p in n for n in names for p in _PARTS) is not merge
        runs.append(run_engine(llm, prompts, 6))
    (outs_m, logits_m), (outs_s, logits_s) = runs
    assert [o.outputs[0].token_ids for o in outs_m] == [o.outputs[0].token_ids for o in outs_s]
    for a, b in zip(logits_m, logits_s, strict=True):
        assert torch.equal(a, b)


class _Two(MergeableProjections):
    MERGED: ClassVar[Mapping[str, tuple[str, ...]]] = {"ab": ("a", "b")}

    def __init__(self, bias: bool, b_in: int = 6) -> None:
        super().__init__()
        self.a = nn.Linear(6, 4, bias=bias)
        self.b = nn.Linear(b_in, 3, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_a_merge_stacks_the_parts_in_order_and_drops_them(bias):
    torch.manual_seed(0)
    m = _Two(bias)
    x = torch.randn(5, 6)
    want = m.project(x, "ab")
    assert merge_projections(m) == 1
    assert not hasattr(m, "a") and not hasattr(m, "b")
    assert m.get_submodule("ab").weight.shape == (7, 6)
    got = m.project(x, "ab")
    assert [g.shape for g in got] == [(5, 4), (5, 3)]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert got[1].stride() == (7, 1)  # a column view of the merged product


def test_parts_that_cannot_merge_are_refused_by_name():
    with pytest.raises(ValueError, match=r"_Two\.ab: parts differ in input or bias"):
        _Two(False, b_in=5).merge_projections()
