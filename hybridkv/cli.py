"""The ``hybridkv`` command line."""

from __future__ import annotations

import argparse
import sys

from hybridkv.report.command import add_plan_parser, run_plan


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hybridkv`` command."""
    parser = argparse.ArgumentParser(
        prog="hybridkv", description="Hybrid-attention KV cache manager."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the worked prefix-caching example")
    add_plan_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from hybridkv.demo import main as demo

        demo()
        return 0
    if args.command == "plan":
        return run_plan(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
