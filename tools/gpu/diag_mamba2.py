"""Why do Bamba and Granite (Mamba2) differ from transformers on CUDA? (issue 47 lease, 2026-11-27)

Runs the tiny Mamba2 checkpoints (``tests/engine/tiny_checkpoints.py``) in float32 on the
device with kernel backends ``triton`` and ``torch``, the three prompts together and one at a
time, and prints, per run, the greedy tokens and the largest logit difference per step
against transformers (float64 on the CPU). Usage: ``python tools/gpu/diag_mamba2.py [family]``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "engine"), str(ROOT / "tests")]
from oracle import cached_hf_greedy, run_engine  # noqa: E402
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint  # noqa: E402

from hybridkv.engine import LLM  # noqa: E402

N = 8


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def main() -> None:
    families = sys.argv[1:] or ["bamba", "granite"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompts = [prompt(n, seed) for seed, n in enumerate((5, 23, 41))]
    for fam in families:
        ckpt = save_checkpoint(FAMILY_CONFIGS[fam](), Path(tempfile.mkdtemp()) / fam)
        refs = [cached_hf_greedy(ckpt, p, N) for p in prompts]
        for backend in ("triton", "torch"):
            for together in (True, False):
                groups = [prompts] if together else [[p] for p in prompts]
                rows = []
                for group in groups:
                    llm = LLM(
                        ckpt, device=device, kernel_backend=backend, block_size=4, dtype="float32"
                    )
                    outs, logits = run_engine(llm, group, N)
                    rows += list(zip(outs, logits, strict=True))
                for (out, lg), (tokens, ref), p in zip(rows, refs, prompts, strict=True):
                    got = out.outputs[0].token_ids
                    k = min(len(lg), len(ref))
                    diff = (lg[:k].double() - ref[:k].double()).abs().amax(dim=-1)
                    print(
                        f"{fam} {backend:6s} {'batch' if together else 'alone'} len={len(p):2d} "
                        f"same={got == tokens} diff/step={[f'{d:.1e}' for d in diff.tolist()]}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
