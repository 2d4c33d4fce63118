"""``hybridkv serve MODEL``: load the model and serve the OpenAI API over HTTP.

The engine options are ``LLM``'s. Bad options, a port in use (found before
the weights load) and a missing ``serve`` extra are one-line errors with exit
code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridkv.common.extras import install_command
from hybridkv.common.user_errors import one_line, report

if TYPE_CHECKING:
    from hybridkv.engine.chat_template import ChatTemplate
    from hybridkv.events.config import KVEventsConfig
    from hybridkv.serving.auth import AccessPolicy

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
        help="a Jinja chat template file (default: the checkpoint's; on the demo checkpoint, "
        "the demo's plain transcript)",
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
        help="hybrid: tokens between two snapshot floor points, fixed (default: by cost; 0: none)",
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
        "--async-scheduling",
        action="store_true",
        help="schedule and fill the next step while one runs on the device (vLLM's option; "
        "steps that sample on the host are not overlapped; works with the tiers)",
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
    p.add_argument(
        "--kv-events-bind-host",
        default=None,
        help="the interface a wildcard-host events endpoint (tcp://*:PORT) binds "
        "(default 127.0.0.1; '*': every interface: subscribers learn the cached prompts' "
        "token ids)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every path but /health (default: "
        "$HYBRIDKV_API_KEY; neither: an open server)",
    )
    p.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve /metrics without the API key",
    )
    p.add_argument(
        "--no-cached-tokens-in-usage",
        action="store_true",
        help="leave usage.prompt_tokens_details.cached_tokens out of replies (a cache hit "
        "tells a caller that someone sent the same prefix)",
    )
    p.add_argument(
        "--kv-offloading-size",
        type=float,
        default=None,
        help="GiB of host RAM for a KV tier under the device pool (vLLM's flag; default: none)",
    )
    p.add_argument("--kv-offloading-backend", default="native", help="native (the only one)")
    p.add_argument(
        "--disk-cache-dir",
        default=None,
        help="a disk tier under the host tier, kept across restarts (needs --kv-offloading-size "
        "and --disk-cache-size)",
    )
    p.add_argument("--disk-cache-size", type=float, default=None, help="GiB for --disk-cache-dir")
    p.add_argument(
        "--preemption-mode",
        choices=["swap", "recompute"],
        default=None,
        help="a preempted request's KV: swap it to the host tier and back, or recompute it "
        "(vLLM's name; default: the load-or-recompute cost model decides)",
    )
    p.add_argument(
        "--kv-store",
        default=None,
        metavar="URL",
        help="a Mooncake Store shared by replicas, under the other tiers (or alone): "
        "mooncake://HOST:PORT?metadata=http://HOST:PORT/metadata[&segment=1GiB...] "
        "(docs/tiers.md); exit 2 if it cannot be reached at start",
    )
    p.add_argument("--log-level", default="info", help="uvicorn's log level")


def access_policy(args: argparse.Namespace) -> AccessPolicy:
    """The API key (``--api-key``, else ``$HYBRIDKV_API_KEY``) and what usage shows."""
    from hybridkv.common import env
    from hybridkv.serving.auth import AccessPolicy

    key = args.api_key if args.api_key is not None else env.api_key()
    if args.metrics_public and key is None:
        raise ValueError("--metrics-public needs --api-key (or $HYBRIDKV_API_KEY)")
    return AccessPolicy(key, args.metrics_public, not args.no_cached_tokens_in_usage)


def events_config(args: argparse.Namespace) -> KVEventsConfig | None:
    """The KV events options as one config (None: no events)."""
    from hybridkv.events.config import resolve_events_config

    config = resolve_events_config(
        None, args.kv_events_endpoint, args.kv_events_replay_endpoint, args.kv_events_topic
    )
    if args.kv_events_bind_host is None:
        return config
    if config is None:
        raise ValueError("--kv-events-bind-host needs --kv-events-endpoint")
    return dataclasses.replace(config, bind_host=args.kv_events_bind_host)


def check_options(args: argparse.Namespace) -> ChatTemplate | None:
    """The server's own options (before the port and the model); returns the
    ``--chat-template`` read and checked, if given. ``ValueError`` on a bad one."""
    access_policy(args)
    events_config(args)
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.disk_cache_dir is not None:
        from hybridkv.tiers.disk_dir import check_writable

        check_writable(Path(args.disk_cache_dir))  # a TierError: one line, exit 2
    if args.kv_store is not None:
        from hybridkv.offload.setup import check_kv_store

        check_kv_store(args.kv_store)  # likewise: names the address
    if args.chat_template is None:
        return None
    from hybridkv.engine.chat_template import ChatTemplate
    from hybridkv.engine.tokenizer import read_chat_template

    text = read_chat_template(args.chat_template)
    return ChatTemplate(text, f"--chat-template {args.chat_template}")


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

    template = check_options(args)
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
        async_scheduling=args.async_scheduling,
        kv_events_config=events_config(args),
        kv_offloading_size=args.kv_offloading_size,
        kv_offloading_backend=args.kv_offloading_backend,
        disk_cache_dir=args.disk_cache_dir,
        disk_cache_size=args.disk_cache_size,
        preemption_mode=args.preemption_mode,
        kv_store=args.kv_store,
        progress=True,
    )
    name = args.served_model_name or str(args.model)
    engine = EngineLoop(llm, max_waiting=args.max_waiting, metrics=ServerMetrics(name))
    if llm.kv_events is not None:
        print(f"hybridkv serve: {events_line(llm.kv_events)}", file=sys.stderr, flush=True)
    template = template or llm.chat_template
    said = template.source if template else "none (chat requests get a 400 naming --chat-template)"
    print(f"hybridkv serve: chat template: {said}", file=sys.stderr, flush=True)
    app = build_app(engine, name, chat_template=template, access=access_policy(args))
    return app, engine


def events_line(publisher: Any) -> str:
    """Where the KV events go, in words (the resolved addresses of bound sockets)."""
    from hybridkv.events.config import bind_address, is_bind_endpoint

    cfg = publisher.config
    pub = "bound at" if is_bind_endpoint(cfg.endpoint) else "connected to"
    line = f"KV events {pub} {publisher.endpoint}"
    if publisher.replay_endpoint is not None:
        line += f", replay bound at {publisher.replay_endpoint}"
    wildcard = [e for e in (cfg.endpoint, cfg.replay_endpoint) if e and bind_address(e, "lo") != e]
    if wildcard and cfg.bind_host != "*":
        line += f" (the wildcard host binds {cfg.bind_host}; --kv-events-bind-host '*': every "
        line += "interface)"
    return line


def listen_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound at once (uvicorn listens on it later); ``ValueError``
    naming the option when the address is taken or cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(
                f"--port {port}: {host}:{port} is already in use; stop what holds it or pass "
                "another --port"
            ) from None
        raise ValueError(f"--host {host} --port {port}: cannot bind ({e.strerror or e})") from None
    return sock


def run_serve(args: argparse.Namespace) -> int:
    """Check the port, load the model, serve until interrupted (one-line errors, exit 2)."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        return report("serve", f"{e.name} is missing: {SERVE_EXTRA}")
    try:
        check_options(args)
        sock = listen_socket(args.host, args.port)  # before the weights load
    except ValueError as e:
        return report("serve", one_line(e))
    try:
        try:
            app, _ = build_server(args)
        except (ValueError, FileNotFoundError, ImportError) as e:
            return report("serve", one_line(e))
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
