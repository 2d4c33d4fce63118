"""``hybridkv serve MODEL``: load the model and serve the OpenAI API over HTTP.

The engine options are ``LLM``'s. Bad options and a missing ``serve`` extra
are one-line errors with exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hybridkv.extras import install_command
from hybridkv.user_errors import one_line, report

SERVE_EXTRA = install_command("serve")


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a checkpoint over an OpenAI-compatible HTTP API")
    p.add_argument("model", help="checkpoint directory (config.json + safetensors) or .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients ask for (default: MODEL as given)",
    )
    p.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        help="a Jinja chat template file (replaces the tokenizer's)",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=1024,
        help="waiting requests beyond which new ones get 503 (default 1024)",
    )
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests running at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per step")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV cache size")
    p.add_argument(
        "--no-enable-prefix-caching", action="store_true", help="turn automatic prefix caching off"
    )
    p.add_argument("--cache-policy", default="lru", help="lru | hybrid")
    p.add_argument(
        "--hybrid-return-bonus",
        type=float,
        default=None,
        help="hybrid: pool turnovers a returning prompt's blocks are kept longer (default 4)",
    )
    p.add_argument(
        "--hybrid-return-grade",
        default=None,
        help="hybrid: how the return bonus grows with the conversation's turn: flat | turn | "
        "log-turn (default flat)",
    )
    p.add_argument(
        "--hybrid-value-weight",
        type=float,
        default=None,
        help="hybrid: pool turnovers one doubling of recompute saved per page is worth "
        "(default: by layout)",
    )
    p.add_argument(
        "--hybrid-floor-tokens",
        type=int,
        default=None,
        help="hybrid: tokens between two snapshot floor points, fixed (default: by cost, "
        "then learned online; 0: none)",
    )
    p.add_argument(
        "--hybrid-tuning",
        action="append",
        metavar="KEY=VALUE",
        help="hybrid: override a fitted number or switch a learner off, e.g. floor_ratio=16 "
        "(repeatable or comma-separated; names: hybridkv.policy.tuning)",
    )
    p.add_argument("--kernel-backend", default=None, help="torch | triton | native")
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="replay decode steps and small steps (up to 511 new tokens) from CUDA graphs "
        "(Gemma 3 on CUDA with the triton backend)",
    )
    p.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="publish KV cache events (vLLM's ZMQ format) at this endpoint, "
        "e.g. tcp://127.0.0.1:5557 (needs the events extra)",
    )
    p.add_argument(
        "--kv-events-replay-endpoint",
        default=None,
        help="the replay (ROUTER) socket for subscribers that missed batches",
    )
    p.add_argument("--kv-events-topic", default=None, help="the events' topic")
    p.add_argument("--log-level", default="info", help="uvicorn's log level")


def _tuning(texts: list[str] | None) -> Any:
    """``--hybrid-tuning`` items -> a ``HybridTuning`` (None: not given)."""
    if not texts:
        return None
    from hybridkv.policy.tuning import DEFAULT_TUNING, parse_tuning

    return DEFAULT_TUNING.with_text(parse_tuning(texts, "--hybrid-tuning"))


def build_server(args: argparse.Namespace) -> tuple[Any, Any]:
    """The LLM-backed ``(app, engine)`` for ``args`` (``ValueError`` on bad options)."""
    from hybridkv.engine import LLM
    from hybridkv.serving.app import build_app
    from hybridkv.serving.engine_loop import EngineLoop
    from hybridkv.serving.metrics import ServerMetrics

    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    template = None
    if args.chat_template is not None:
        from hybridkv.engine.tokenizer import read_chat_template

        template = read_chat_template(args.chat_template)
    llm = LLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_enable_prefix_caching,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        cache_policy=args.cache_policy,
        hybrid_return_bonus=args.hybrid_return_bonus,
        hybrid_return_grade=args.hybrid_return_grade,
        hybrid_value_weight=args.hybrid_value_weight,
        hybrid_floor_tokens=args.hybrid_floor_tokens,
        hybrid_tuning=_tuning(args.hybrid_tuning),
        kernel_backend=args.kernel_backend,
        cuda_graphs=args.cuda_graphs,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_replay_endpoint=args.kv_events_replay_endpoint,
        kv_events_topic=args.kv_events_topic,
        progress=True,
    )
    name = args.served_model_name or str(args.model)
    engine = EngineLoop(llm, max_waiting=args.max_waiting, metrics=ServerMetrics(name))
    return build_app(engine, name, chat_template=template), engine


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        return report("serve", f"{e.name} is missing: {SERVE_EXTRA}")
    try:
        app, _ = build_server(args)
    except (ValueError, FileNotFoundError, ImportError) as e:
        return report("serve", one_line(e))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
