"""The ``hybridkv plan`` subcommand: arguments and entry point.

``run_plan`` prints the report to stdout and returns 0. User errors (a model
that cannot be found or read, a memory size it cannot parse, a budget below
one ``max_model_len`` request, a ``--max-model-len`` beyond the model's
positions, a bad ``--plot`` path, matplotlib missing for ``--plot``) print one
``hybridkv plan: error: ...`` message to stderr and return 2, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hybridkv.common.user_errors import EXIT_USER_ERROR
from hybridkv.common.user_errors import report as report_error
from hybridkv.planning import GROUPINGS, STRATEGIES
from hybridkv.report.units import MEMORY_UNITS, parse_memory

__all__ = ["EXIT_USER_ERROR", "add_plan_parser", "run_plan"]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_plan_parser(sub: Any) -> None:
    """Add ``plan`` to the ``hybridkv`` subparsers ``sub``."""
    p = sub.add_parser(
        "plan",
        help="plan the KV cache memory of a model and explain the plan",
        description="Plan the KV cache memory of a model (groups, buffers, blocks) and "
        "compare it with a naive allocation and with vLLM's grouping.",
    )
    p.add_argument(
        "model", help="a .yaml/.yml layout, a Hugging Face model folder, or a shipped name"
    )
    p.add_argument(
        "--memory",
        required=True,
        help=f"KV cache memory: bytes, or a number with a suffix ({', '.join(MEMORY_UNITS)})",
    )
    p.add_argument(
        "--max-model-len",
        type=_positive,
        help="default (and most): the layout's max_model_len, the model's positions",
    )
    p.add_argument("--block-size", type=_positive, default=16, help="tokens per block (16)")
    p.add_argument("--grouping", choices=GROUPINGS, default="auto", help="(auto)")
    p.add_argument("--unification", choices=STRATEGIES, default="vllm", help="(vllm)")
    p.add_argument(
        "--max-num-batched-tokens", type=_positive, help="default: min(8192, max_model_len)"
    )
    p.add_argument("--max-groups", type=_positive, default=8, help="group cap of auto grouping (8)")
    p.add_argument("--verbose", action="store_true", help="list every grouping choice")
    p.add_argument(
        "--plot",
        metavar="PATH",
        help="write the layout and capacity figure at PATH (PNG; .svg and .pdf by suffix)",
    )


def run_plan(args: argparse.Namespace) -> int:
    """Run ``hybridkv plan`` with parsed ``args``; 0 on success, 2 on user errors."""
    # Imported here, not with the module: ``hybridkv --help`` registers this command
    # without paying for pydantic and the layouts.
    from hybridkv.layouts.context_length import check_max_model_len
    from hybridkv.report.plan_report import PlanOptions, build_plan_report
    from hybridkv.report.plan_table import render_plan
    from hybridkv.report.resolve import resolve_layout

    try:
        if args.plot:
            from hybridkv.report.plot import plot_format

            plot_format(Path(args.plot))
        options = PlanOptions(
            memory_bytes=parse_memory(args.memory),
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            grouping=args.grouping,
            unification=args.unification,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_groups=args.max_groups,
        )
        layout = resolve_layout(args.model)
        if args.max_model_len is not None:
            check_max_model_len(
                args.max_model_len,
                layout.max_model_len,
                model=layout.name,
                limit_name="the layout's max_model_len",
            )
        report = build_plan_report(layout, options)
        text = render_plan(report, verbose=args.verbose)
        if args.plot:
            from hybridkv.report.plot import save_plan_figure

            save_plan_figure(report, args.plot)
    except ValueError as e:
        return report_error("plan", e)
    sys.stdout.write(text)
    if args.plot:
        print(f"figure written to {args.plot}")
    return 0
