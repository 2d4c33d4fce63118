"""Scheduler policy (budget, victims) and the `generate` / `demo` entry points, tiny model."""

from __future__ import annotations

import pytest
from tiny_checkpoints import gemma3_config, save_checkpoint, save_word_tokenizer

from hybridkv.cli import main
from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.demo import run as run_demo


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3_sched"))
    return save_word_tokenizer(path)


def test_budget_and_seats_are_respected(ckpt):
    llm = LLM(ckpt, block_size=4, max_num_seqs=2, max_num_batched_tokens=6)
    steps = []
    schedule = llm.scheduler.schedule

    def tracked():
        out = schedule()
        steps.append(out)
        assert out.num_tokens <= 6 and len(llm.scheduler.running) <= 2
        return out

    llm.scheduler.schedule = tracked
    prompts = [{"prompt_token_ids": list(range(5 + i, 20 + i))} for i in range(3)]
    llm.generate(prompts, SamplingParams(max_tokens=3), use_tqdm=False)
    # Chunked prefill: 15-token prompts need several steps; steps mix prefill and decode.
    assert any(len({s.num_tokens for s in o.scheduled}) > 1 for o in steps)
    assert max(o.num_tokens for o in steps) == 6


def test_preemption_takes_the_most_recently_admitted(ckpt):
    llm = LLM(ckpt, block_size=4, max_model_len=48, kv_cache_memory_bytes=60_000)
    victims = []
    schedule = llm.scheduler.schedule

    def tracked():
        before = [r.request_id for r in llm.scheduler.running]
        out = schedule()
        if out.preempted:
            assert list(out.preempted) == before[::-1][: len(out.preempted)]
            victims.extend(out.preempted)
        return out

    llm.scheduler.schedule = tracked
    prompts = [{"prompt_token_ids": list(range(5 + 7 * i, 25 + 7 * i))} for i in range(4)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=20), use_tqdm=False)
    assert victims and sum(o.num_preemptions for o in outs) == len(victims)
    llm.manager.check_integrity()


def test_cli_generate(ckpt, capsys):
    assert main(["generate", str(ckpt), "--prompt", "w5 w6 w7", "--max-tokens", "5"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 5 and all(w.startswith("w") for w in out.split())
    assert "3 prompt tokens, 5 output tokens" in err
    assert main(["generate", str(ckpt), "--prompt", "w5", "--chat", "--max-tokens", "2"]) == 0
    assert main(["generate", str(ckpt / "missing"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_script_runs_on_a_tiny_model(ckpt, capsys):
    llm = LLM(ckpt, block_size=4, max_model_len=1024)
    figures = run_demo(llm)
    out = capsys.readouterr().out
    assert "turn 3" in out and "document cached" in out
    # The five batched questions reuse the document that the cold question cached.
    assert figures["hit_rate"] > 0.5
    llm.manager.check_integrity()
