"""Roofline of the engine's batch-throughput case: how fast could any engine be here?

    .venv/bin/python research/engine_roofline.py [--model DIR] [--dtype D] [--write]

For ``bench_engine.py``'s case 1 (16 prompts of 256 tokens, 64 new tokens
each, greedy) on this machine, measures in one process:

- the memory bandwidth a bandwidth-bound op reaches (the best of a read-only
  ``sum`` over 512 MB and the model's LM head product for 16 rows);
- the matmul rate of the prefill's largest products (the MLP's, 2,048 rows);
- the time hybridkv and transformers ``generate`` actually take on the case.

From the checkpoint it counts what every decode step must move at least
(each linear weight once, LM head included, plus every K/V row the 16
sequences attend to) and what the prefill must compute (2 x weights x tokens
for the linears). The lower bound on the case is then ``prefill FLOPs / matmul
rate + 63 x step bytes / bandwidth`` (everything else taken as free), and
each engine's share of it is printed: the most any engine can be ahead of
transformers here is ``transformers' time / bound``.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import arguments, corpus, emit, engine, hf_generate, hf_model  # noqa: E402

from hybridkv.engine import SamplingParams  # noqa: E402

N_PROMPTS, LENGTH, NEW = 16, 256, 64


def best_seconds(fn: Any, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def read_bandwidth(dtype: torch.dtype) -> float:
    """Bytes/s of a read-only ``sum`` over a 512 MB (bf16) tensor."""
    big = torch.ones(256 * 2**20, dtype=dtype)
    return big.numel() * big.element_size() / best_seconds(lambda: big.sum())


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weight of every linear product a token goes through (LM head included)."""
    out = []
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and not isinstance(mod, torch.nn.Embedding):
            out.append(w)
    return out


def main() -> int:
    args = arguments(__doc__, "bfloat16", "roofline-*.md").parse_args()
    dtype, llm = engine(args, "cpu")
    cfg = llm.model.config
    size = torch.finfo(dtype).bits // 8

    # What a decode step moves at least, and what the prefill computes.
    weights = linear_weights(llm.model)
    weight_bytes = sum(w.numel() for w in weights) * size
    weight_params = sum(w.numel() for w in weights) - cfg.vocab_size * cfg.hidden_size
    kv_row = 2 * cfg.num_key_value_heads * cfg.head_dim * size  # K and V of one token, one layer
    mean_ctx = LENGTH + NEW / 2
    kv_bytes = N_PROMPTS * mean_ctx * kv_row * cfg.num_hidden_layers
    step_bytes = weight_bytes + kv_bytes
    prefill_flops = 2 * weight_params * N_PROMPTS * LENGTH  # LM head: only the last rows

    # Machine rates.
    bw_sum = read_bandwidth(dtype)
    head = llm.model.lm_head
    h16 = torch.randn(N_PROMPTS, cfg.hidden_size, dtype=dtype)
    with torch.inference_mode():
        bw_head = head.weight.numel() * size / best_seconds(lambda: head(h16))
        down = llm.model.model.layers[0].mlp.down_proj  # gate/up are one GEMM once merged
        x = torch.randn(2048, cfg.intermediate_size, dtype=dtype)
        flops = 2 * 2048 * down.weight.numel() / best_seconds(lambda: down(x))
    bandwidth = max(bw_sum, bw_head)
    bound = prefill_flops / flops + (NEW - 1) * step_bytes / bandwidth

    # What the two engines take.
    tok = llm.tokenizer
    text = corpus(tok, LENGTH + 16 * N_PROMPTS)
    prompts = [text[i * 13 : i * 13 + LENGTH] for i in range(N_PROMPTS)]
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    reqs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(reqs[:2], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    llm.manager.reset_prefix_cache()
    t = time.perf_counter()
    llm.generate(reqs, params, use_tqdm=False)
    ours = time.perf_counter() - t
    hf = hf_model(args.model, dtype)
    hf_generate(hf, prompts[:2], 2, tok.pad_token_id or 0)
    _, theirs = hf_generate(hf, prompts, NEW, tok.pad_token_id or 0)

    mb = 1e6
    lines = [
        f"# Roofline of the batch case: {args.model.name}, {args.dtype}, cpu", "",
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
        f"torch {torch.__version__}. Case: {N_PROMPTS} x {LENGTH}-token prompts -> {NEW} "
        "new tokens (bench_engine.py case 1).", "",
        "| quantity | value |", "| --- | ---: |",
        f"| linear weights read per decode step (LM head included) | {weight_bytes / mb:.0f} MB |",
        f"| K/V rows read per decode step (mean context {mean_ctx:.0f}) | {kv_bytes / mb:.0f} MB |",
        f"| memory bandwidth: read-only sum / LM head product | {bw_sum / 1e9:.1f} / "
        f"{bw_head / 1e9:.1f} GB/s |",
        f"| decode step lower bound (bytes / best bandwidth) | "
        f"{step_bytes / bandwidth * 1e3:.1f} ms |",
        f"| prefill linears: {prefill_flops / 1e12:.2f} TFLOP at {flops / 1e12:.2f} TFLOP/s | "
        f"{prefill_flops / flops:.2f} s |",
        f"| lower bound on the case (nothing else costs) | {bound:.2f} s |",
        f"| hybridkv | {ours:.2f} s ({bound / ours:.0%} of the bound) |",
        f"| transformers `generate` | {theirs:.2f} s ({bound / theirs:.0%} of the bound) |",
        f"| hybridkv vs transformers | {theirs / ours:.2f}x |",
        f"| most any engine can be ahead of transformers here | {theirs / bound:.2f}x |",
        f"| share of the bound a 2x engine must reach | {2 * bound / theirs:.0%} |",
    ]  # fmt: skip
    emit(lines, f"roofline-cpu-{args.dtype}.md", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
