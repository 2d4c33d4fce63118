"""``hybridkv generate MODEL --prompt "..."``: one completion from the command line.

``--chat`` wraps the prompt as one user turn of the checkpoint's chat
template (or its default: ``hybridkv.engine.chat_template``), or of
``--chat-template FILE`` (Jinja); without any, it fails before the weights load.
Prints the completion, then one line of figures (prompt and output tokens,
prefix-cache hit, time to first token, decode speed) on stderr. User errors (a
missing or broken checkpoint, a bad argument) print one ``hybridkv generate:
error: ...`` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from hybridkv.common.user_errors import report


def add_generate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="generate text with a Hugging Face or GGUF checkpoint")
    p.add_argument("model", help="checkpoint directory (config.json + safetensors) or .gguf file")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--chat", action="store_true", help="apply the chat template (one user turn)")
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template file for --chat (default: the checkpoint's)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    p.add_argument(
        "--allow-long-max-model-len",
        action="store_true",
        help="allow --max-model-len beyond the model's positions (RoPE-scaled models only)",
    )


def _read_template(path: str | None) -> str | None:
    from hybridkv.engine.tokenizer import read_chat_template

    return None if path is None else read_chat_template(path)


def _require_chat_template(model: str) -> None:
    """``ValueError`` naming ``--chat-template`` when the checkpoint has no template and
    no default (checked on the tokenizer, before the weights load)."""
    from hybridkv.engine.chat_template import default_chat_template, missing_template_message
    from hybridkv.engine.model_source import resolve_model_dir
    from hybridkv.engine.tokenizer import load_tokenizer

    path = resolve_model_dir(model, progress=True)
    if default_chat_template(load_tokenizer(path), path) is None:
        raise ValueError(
            missing_template_message(
                "pass one: hybridkv generate MODEL --chat --chat-template FILE"
            )
        )


def run_generate(args: argparse.Namespace) -> int:
    from hybridkv.engine import LLM, SamplingParams

    try:
        if args.chat_template is not None and not args.chat:
            raise ValueError("--chat-template applies only with --chat")
        template = _read_template(args.chat_template)
        if args.chat and template is None:
            _require_chat_template(args.model)
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
        )
        llm = LLM(
            args.model,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            allow_long_max_model_len=args.allow_long_max_model_len,
            progress=True,
        )
        if args.chat:
            conv = [{"role": "user", "content": args.prompt}]
            out = llm.chat(conv, params, use_tqdm=False, chat_template=template)[0]
        else:
            out = llm.generate(args.prompt, params, use_tqdm=False)[0]
    except (ValueError, FileNotFoundError, ImportError) as e:
        return report("generate", e)
    print(out.outputs[0].text)
    m = out.metrics
    n = len(out.outputs[0].token_ids)
    ttft = m.time_to_first_token or 0.0
    decode = (m.finished_time or 0.0) - (m.first_token_time or 0.0)
    speed = f"{(n - 1) / decode:.1f} tok/s" if n > 1 and decode > 0 else "n/a"
    print(
        f"[{len(out.prompt_token_ids)} prompt tokens, {n} output tokens, "
        f"{out.num_cached_tokens} cached; TTFT {ttft * 1000:.0f} ms; decode {speed}]",
        file=sys.stderr,
    )
    return 0
