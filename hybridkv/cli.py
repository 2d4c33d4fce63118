"""The ``hybridkv`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hybridkv`` command."""
    parser = argparse.ArgumentParser(
        prog="hybridkv", description="Hybrid-attention KV cache manager."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the worked prefix-caching example")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from hybridkv.demo import main as demo

        demo()
        return 0
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
