"""What ``SamplingParams``' docstring claims about seeds and batches, tested as stated.

1. The sampler: given the same logits row, a seeded request draws the same
   token whatever the other rows are, whatever its row index.
2. The engine: the same calls on a fresh engine with the same arguments give
   the same tokens, seeded and greedy, in float32 and bfloat16.

What it does not claim (batch-invariant logits) is not tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampler import sample


def seeded(rid: str, seed: int) -> EngineRequest:
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=seed)
    return EngineRequest(rid, [5, 6], params)


def test_a_seeded_row_draws_the_same_token_in_any_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 512, generator=gen)
    mine = logits[0]
    alone = []
    mine_req = seeded("a", 1234)
    for _ in range(5):
        alone.append(sample(mine[None], [mine_req]).tokens[0])
    for position in range(4):
        rows = [logits[k] for k in (1, 2, 3)]
        rows.insert(position, mine)
        requests = [seeded(f"o{k}", 7 + k) for k in range(3)]
        me = seeded("a", 1234)
        requests.insert(position, me)
        drawn = []
        for _ in range(5):  # the others draw too: they must not use my generator
            drawn.append(sample(torch.stack(rows), requests).tokens[position])
        assert drawn == alone


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_same_calls_on_a_fresh_engine_give_the_same_tokens(tiny_ckpt: Path, dtype: str) -> None:
    prompts = [{"prompt_token_ids": [5 + k, 9, 11 + 2 * k, 40 + k]} for k in range(8)]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=100 + k) for k in range(6)]
    params += [SamplingParams(max_tokens=6)] * 2  # and two greedy ones

    def run() -> list[list[int]]:
        llm = LLM(tiny_ckpt, dtype=dtype, block_size=4, max_model_len=64, max_num_batched_tokens=16)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]

    assert run() == run()
