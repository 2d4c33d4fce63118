"""``hybridkv demo``: a real hybrid model (Gemma 3 270M) chatting and answering from one document.

Runs offline on the CPU, in bf16 where the CPU has oneDNN bf16 support (else
float32): the checkpoint comes from the ``demo`` extra (the public Gemma 3 270M
GGUF, converted once to cached safetensors). It prints the
KV layout the planner chose (15 sliding-window layers and 3 full-attention
layers in separate groups), then

1. a three-turn chat: each turn re-sends the whole conversation, and the
   previous turns come back from the prefix cache;
2. six questions about one shared document: the first is asked alone (cold),
   the other five together, reusing the document's cached blocks;

with every request's time to first token and cache hit, the hit rate, the
blocks in use and the throughput.
"""

from __future__ import annotations

import time

from hybridkv.common.units import format_bytes
from hybridkv.engine.chat_template import transcript_template
from hybridkv.engine.demo_text import CHAT_TURNS, QUESTIONS, document_prompt
from hybridkv.engine.llm import LLM
from hybridkv.engine.outputs import RequestOutput
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.specs import AttentionSpec, MambaSpec, SlidingWindowSpec

MAX_TOKENS = 48


def _layout(llm: LLM) -> None:
    cfg = llm.kv_cache_config
    print(
        f"\nKV layout: {len(cfg.kv_cache_groups)} groups, {cfg.num_blocks:,} blocks of "
        f"{format_bytes(llm.plan.page_bytes)} "
        f"({format_bytes(sum(t.size for t in cfg.kv_cache_tensors))} in all)"
    )
    for g, group in enumerate(cfg.kv_cache_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            kind = f"sliding window {spec.sliding_window}"
        elif isinstance(spec, MambaSpec):
            kind = "mamba state"
        elif isinstance(spec, AttentionSpec):
            kind = type(spec).__name__.removesuffix("Spec")
        layers = ", ".join(n.removeprefix("layers.") for n in group.layer_names)
        print(f"  group {g}: {kind:<20} block {spec.block_size:>3} tokens, layers {layers}")


def _report(label: str, out: RequestOutput) -> None:
    ttft = out.metrics.time_to_first_token or 0.0
    n = len(out.prompt_token_ids)
    print(
        f"  [{label}] prompt {n} tokens, {out.num_cached_tokens} from cache "
        f"({out.num_cached_tokens / n:.0%}), time to first token {ttft * 1000:.0f} ms"
    )
    print(f"  > {out.outputs[0].text.strip()}\n")


def _chat_setup(llm: LLM) -> tuple[SamplingParams, str | None]:
    """Sampling (greedy, stop at a line end when templating) and the template to use."""
    tok = llm.tokenizer
    if tok is None:
        raise ValueError("the demo needs a checkpoint with a tokenizer")
    if getattr(tok, "chat_template", None):
        return SamplingParams(max_tokens=MAX_TOKENS), None
    print(
        "note: the tokenizer has no chat template (a base model): using a plain "
        "'User: / Assistant:' transcript, each reply ending at its line end"
    )
    stops = {
        ids[0] for s in ("\n", "\n\n") if len(ids := tok.encode(s, add_special_tokens=False)) == 1
    }
    return SamplingParams(
        max_tokens=MAX_TOKENS, stop_token_ids=tuple(sorted(stops))
    ), transcript_template()


def run(llm: LLM) -> dict[str, float]:
    """The chat and the document questions; returns the figures it printed."""
    params, template = _chat_setup(llm)
    start = time.monotonic()
    generated = 0
    print("\n== 1. A multi-turn chat (each turn re-sends the conversation) ==")
    conv: list[dict[str, str]] = []
    for k, turn in enumerate(CHAT_TURNS):
        conv.append({"role": "user", "content": turn})
        print(f"user: {turn}")
        out = llm.chat(conv, params, use_tqdm=False, chat_template=template)[0]
        _report(f"turn {k + 1}", out)
        conv.append({"role": "assistant", "content": out.outputs[0].text.strip()})
        generated += len(out.outputs[0].token_ids)
    print("== 2. Questions about one shared document ==")
    print(f"Q: {QUESTIONS[0]}")
    first = [{"role": "user", "content": document_prompt(QUESTIONS[0])}]
    cold = llm.chat(first, params, use_tqdm=False, chat_template=template)[0]
    _report("cold, alone", cold)
    convs = [[{"role": "user", "content": document_prompt(q)}] for q in QUESTIONS[1:]]
    outs = llm.chat(convs, params, use_tqdm=True, chat_template=template)
    for q, out in zip(QUESTIONS[1:], outs, strict=True):
        print(f"Q: {q}")
        _report("batch, document cached", out)
    generated += sum(len(o.outputs[0].token_ids) for o in [cold, *outs])
    elapsed = time.monotonic() - start
    hit_ttft = sum(o.metrics.time_to_first_token or 0.0 for o in outs) / len(outs)
    cold_ttft = cold.metrics.time_to_first_token or 0.0
    prompt = sum(len(o.prompt_token_ids) for o in [cold, *outs])
    cached = sum(o.num_cached_tokens for o in [cold, *outs])
    print("== Summary ==")
    print(
        f"  document questions: {cached:,} of {prompt:,} prompt tokens from the cache "
        f"({cached / prompt:.0%}); time to first token {cold_ttft * 1000:.0f} ms cold vs "
        f"{hit_ttft * 1000:.0f} ms on average with hits in a batch of {len(outs)}"
    )
    print(
        f"  generated {generated} tokens in {elapsed:.1f} s "
        f"({generated / elapsed:.1f} tokens/s, {llm.num_steps} engine steps)"
    )
    print(
        f"  KV blocks in use now (cached, evictable): {llm.manager.block_pool.num_cached_blocks()} "
        f"of {llm.kv_cache_config.num_blocks:,}; preemptions: {llm.scheduler.num_preemptions}"
    )
    return {"cold_ttft": cold_ttft, "hit_ttft": hit_ttft, "hit_rate": cached / prompt}


def main() -> int:
    """Entry point of ``hybridkv demo``."""
    import torch

    from hybridkv.models.demo_checkpoint import demo_checkpoint
    from hybridkv.models.layers.packed_linear import describe_linears, packing_supported

    print("hybridkv demo: Gemma 3 270M (18 layers: 15 sliding-window + 3 full attention), CPU")
    path = demo_checkpoint(progress=True)
    # bf16 where the CPU has oneDNN bf16 (AMX / AVX512-BF16): ~2x faster here, same answers.
    dtype = "bfloat16" if packing_supported(torch.device("cpu"), torch.bfloat16) else "float32"
    t = time.monotonic()
    # The hybrid cache policy: on the Mooncake conversation trace it keeps more
    # reusable prefixes per GB for Gemma 3 than lru (benchmarks/results/cache.md).
    llm = LLM(
        path,
        dtype=dtype,
        device="cpu",
        max_model_len=4096,
        max_num_batched_tokens=1024,
        cache_policy="hybrid",
        progress=True,
    )
    print(
        f"loaded {path.name} in {time.monotonic() - t:.1f} s ({llm.dtype}, {llm.device}, "
        f"kernels: {llm.kernel_backend}; linear layers: {describe_linears(llm.model)}; "
        "cache policy: hybrid)"
    )
    _layout(llm)
    run(llm)
    return 0
