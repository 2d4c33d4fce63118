"""A checkpoint of a real model's shape with random weights, for speed runs without its weights.

    .venv/bin/python benchmarks/random_checkpoint.py gemma-3-270m OUT_DIR [--seed N]

Why: a lent GPU machine has no network and a call carries at most 64 MiB, so the demo's
Gemma 3 270M GGUF (245 MB) takes five calls to carry (``tools/gpu/prepare.py``), which a
15-minute lease cannot afford beside the kernel checks. What the engine benchmarks time
(``bench_engine.py``'s throughput and shared-document TTFT, ``step_profile.py``) depends on
the model's shape, not on its weights: the same layers, heads, vocabulary and dtype do the
same work. So they can run on a checkpoint of the same ``config.json`` with weights drawn
at transformers' own initialisation (normal, std ``initializer_range``), written here in
seconds on the machine itself.

What it cannot show: anything that depends on the trained weights. Its greedy outputs
are those of a random model (the engine and transformers still have to agree on them,
which ``bench_engine.py`` counts), and the bf16 divergence study
(``explain_divergence.py``) needs the real checkpoint. Results from it say
"random weights" in their title.

``SHAPES`` holds the published configuration of each model (Gemma 3 270M:
``google/gemma-3-270m``'s ``config.json``: 18 layers, hidden 640, MLP 2,048, 4 query / 1 KV
heads of 256, vocabulary 262,144, a 512-token window on 5 of every 6 layers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

#: Name -> the ``config.json`` of the model (its shape; no weights).
SHAPES: dict[str, dict[str, Any]] = {
    "gemma-3-270m": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 262_144,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 32_768,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-6,
        "sliding_window": 512,
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)
        ],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    },
}

#: The marker a finished checkpoint carries (a half-written folder is never reused).
MARKER = "random-weights.json"


def write_random_checkpoint(
    name: str, out: Path, seed: int = 0, overrides: dict[str, Any] | None = None
) -> Path:
    """``out`` holding ``SHAPES[name]``'s config (with ``overrides``: the tests shrink it)
    and random weights (bf16 safetensors), made once: a folder with ``MARKER`` for the
    same name, seed and overrides is reused as is.

    Raises ``KeyError`` naming the known shapes for an unknown ``name``, and
    ``FileExistsError`` for a non-empty ``out`` without a matching marker.
    """
    if name not in SHAPES:
        raise KeyError(f"unknown shape {name!r}; known: {', '.join(sorted(SHAPES))}")
    stamp = {"shape": name, "seed": seed, "overrides": overrides or {}}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty and holds no random checkpoint of {stamp}")
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**SHAPES[name], **(overrides or {})}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    marker.write_text(json.dumps(stamp))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(write_random_checkpoint(args.shape, args.out, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
