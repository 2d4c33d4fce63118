"""The ``hybridkv`` command line (also ``python -m hybridkv``; ``--version`` prints the version).

Each subcommand prints a user error as one ``hybridkv COMMAND: error: ...``
line and exits with status 2 (``hybridkv.common.user_errors``); argparse does the
same for bad arguments.

``--help``, ``plan``, ``walkthrough`` and ``simulate`` (the engine's scheduler
on a cost model, no model) need only the core install: the modules that register
the subcommands import nothing heavy, and a subcommand that needs an extra
(``ENGINE_COMMANDS``) checks for it first, naming the ``pip install`` to run
(``simulate --plot`` checks for ``plot`` itself).
"""

from __future__ import annotations

import argparse
import sys

from hybridkv import __version__
from hybridkv.common.extras import MissingExtraError, require
from hybridkv.common.user_errors import report
from hybridkv.engine.cli_generate import add_generate_parser, run_generate
from hybridkv.report.command import add_plan_parser, run_plan
from hybridkv.serving.command import add_serve_parser, run_serve
from hybridkv.sim.command import add_simulate_parser, run_simulate

# Subcommand -> (the extra it needs, the modules of that extra it imports).
ENGINE_COMMANDS = {
    "demo": ("demo", ("torch", "transformers", "gguf")),
    "generate": ("engine", ("torch", "transformers")),
    "serve": ("serve", ("torch", "transformers")),  # serve implies engine
}


def _check_extras(command: str) -> None:
    """Raise ``MissingExtraError`` if ``command`` needs a module that is not installed."""
    if command in ENGINE_COMMANDS:
        extra, modules = ENGINE_COMMANDS[command]
        for module in modules:
            require(module, extra, f"hybridkv {command}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hybridkv`` command."""
    parser = argparse.ArgumentParser(
        prog="hybridkv", description="Hybrid-attention KV cache manager."
    )
    parser.add_argument("--version", action="version", version=f"hybridkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="chat and shared-document questions on Gemma 3 270M (offline)")
    sub.add_parser("walkthrough", help="print the worked prefix-caching example (manager only)")
    add_plan_parser(sub)
    add_generate_parser(sub)
    add_simulate_parser(sub)
    add_serve_parser(sub)
    args = parser.parse_args(argv)
    try:
        _check_extras(args.command)
    except MissingExtraError as e:
        return report(args.command, e)
    if args.command == "demo":
        from hybridkv.engine.demo import main as demo

        return demo()
    if args.command == "walkthrough":
        from hybridkv.walkthrough import main as walkthrough

        walkthrough()
        return 0
    if args.command == "plan":
        return run_plan(args)
    if args.command == "generate":
        return run_generate(args)
    if args.command == "simulate":
        return run_simulate(args)
    if args.command == "serve":
        return run_serve(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
