"""The ``hybridkv simulate`` subcommand: arguments, checks, runs, outputs.

    hybridkv simulate gemma-3-27b --trace conv.jsonl --memory 40GB,80GB \\
        --policy lru,hybrid --requests 1500 --json out.json --plot hit.png

``--memory``, ``--host-memory`` and ``--policy`` take comma lists: every
(budget, host, policy) triple is replayed, in that order. ``--host-memory``
(and ``--disk`` below it) model tiers under the device pool
(``hybridkv.sim.tier_model``); with them, ``--plot`` draws hit rate against
host memory, and ``--preemption-mode`` (``swap`` | ``recompute``; default: the
engine's swap rule) decides what a preempted request does
(``hybridkv.sim.tier_swap``). ``--return-bonus``, ``--return-grade``, ``--value-weight``
and ``--floor-tokens`` (comma lists too) tune ``hybrid``: each ``hybrid`` run is
repeated for every combination, to try them on one's own trace;
``--tuning key=value`` overrides ``HybridTuning`` for every ``hybrid`` run.
They are an error without ``hybrid`` in ``--policy``. ``run_simulate`` prints
one table row per replay on stdout (a progress bar per replay on stderr) and
returns 0. Every user error (a bad option value, a bad trace line, a budget
that cannot hold the longest request, an unknown layout or active parameter
count, ``--plot`` with fewer than two budgets) is found before the first
replay where it can be, printed as one ``hybridkv simulate: error: ...`` line
on stderr, and returns 2 with no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridkv.offload.swap_decision import PREEMPTION_MODES
from hybridkv.policy.options import check_return_grade
from hybridkv.policy.tuning import DEFAULT_TUNING, parse_tuning
from hybridkv.report.units import MEMORY_UNITS, parse_memory
from hybridkv.sim.cost_model import CostModel
from hybridkv.sim.devices import DEVICES, device_profile
from hybridkv.sim.model_params import active_params_for
from hybridkv.sim.options import ARRIVALS, SimOptions
from hybridkv.sim.result import SimResult
from hybridkv.sim.table import memory_label, render_results
from hybridkv.sim.trace import TraceRequest, load_trace

if TYPE_CHECKING:
    from hybridkv.layouts import ModelLayout

EXIT_USER_ERROR = 2


def add_simulate_parser(sub: Any) -> None:
    """Add ``simulate`` to the ``hybridkv`` subparsers ``sub``."""
    p = sub.add_parser(
        "simulate",
        help="replay a request trace through the scheduler and KV cache manager",
        description="Replay a request trace (Mooncake jsonl or token prompts) through the "
        "engine's scheduler and KV cache manager, with step times from a cost model; "
        "report prefix hit rate, cache contents by kind, preemptions, the share of the "
        "blocks running requests hold (pinned: no cache policy decides on them), modeled TTFT and "
        "throughput.",
    )
    p.add_argument(
        "layout", help="a .yaml/.yml layout, a Hugging Face model folder, or a shipped name"
    )
    p.add_argument("--trace", required=True, help="the trace: one JSON object per line")
    p.add_argument(
        "--memory",
        required=True,
        help="KV cache memory, or a comma list of them (bytes or a number with a suffix: "
        f"{', '.join(MEMORY_UNITS)})",
    )
    p.add_argument(
        "--host-memory",
        help="model a host-RAM tier of this size under the device pool, or a comma list "
        "(lru: every block written through to it, LRU; hybrid: what the pool evicts is "
        "demoted to it, ranked by value per byte); tier hits are loaded, not computed, at "
        f"the device's host->device bandwidth ({_links('host_to_device_bandwidth')})",
    )
    p.add_argument(
        "--disk",
        help="model a local-disk tier of this size below the host tier (lru: written through; "
        "hybrid: what the host evicts); a disk hit is read at the disk->host bandwidth "
        f"({_links('disk_to_host_bandwidth')}) then copied to the device. Sources: pinned "
        "PCIe copy figures and NVMe datasheets, hybridkv/sim/devices.py",
    )
    p.add_argument(
        "--preemption-mode",
        choices=PREEMPTION_MODES,
        help="with --host-memory, what a preempted request does (the engine's "
        "preemption_mode): swap stores the units of its longest held hit in the host tier "
        "and its resume loads them; recompute recomputes. Default: as the engine with it "
        "unset, the swap rule: only units the device's reuse would lose (free, in no tier, "
        "not demoted by the policy) are copied, into the host's spare room only, when twice "
        "their copy time at the device's host->device bandwidth is below the cost model's "
        "prefill time of the tokens they keep; under hybrid (which demotes what the pool "
        "reuses) that is nothing, as recompute. Without --host-memory, recompute (swap is an "
        "error)",
    )
    p.add_argument("--requests", help="replay only the first N requests")
    p.add_argument(
        "--policy", default="lru", help="lru | hybrid, or a comma list such as lru,hybrid (lru)"
    )
    p.add_argument(
        "--arrivals", default="trace", help=f"{' | '.join(ARRIVALS)}: when requests arrive (trace)"
    )
    p.add_argument(
        "--output-tokens",
        default="trace",
        help="trace (each request's output_length) or N for every request (trace)",
    )
    p.add_argument("--max-num-seqs", default="64", help="running requests at most (64)")
    p.add_argument("--max-num-batched-tokens", default="8192", help="tokens per step (8192)")
    p.add_argument("--block-size", default="16", help="tokens per block (16)")
    p.add_argument(
        "--max-model-len", help="default: the longest replayed request (prompt + output)"
    )
    p.add_argument("--device", default="h100", help=f"{' | '.join(DEVICES)} (h100)")
    p.add_argument(
        "--active-params",
        help="parameters per token's forward pass (e.g. 12e9); default: the shipped table",
    )
    p.add_argument("--hash-algo", default="sha256", help="sha256 | xxhash (sha256)")
    p.add_argument(
        "--return-bonus",
        help="hybrid: pool turnovers a returning prompt's blocks are kept longer, or a comma "
        "list to compare (default: the manager's, 4; 0: off)",
    )
    p.add_argument(
        "--return-grade",
        help="hybrid: how the return bonus grows with the conversation's turn, flat | turn | "
        "log-turn, or a comma list (default flat)",
    )
    p.add_argument(
        "--value-weight",
        help="hybrid: pool turnovers one doubling of recompute saved per page is worth, or a "
        "comma list (default: by layout, 1 sliding, 2 Mamba, 8 chunked; 0: recency only)",
    )
    p.add_argument(
        "--floor-tokens",
        help="hybrid: tokens between two snapshot floor points, fixed, or a comma list "
        "(default: by cost, at most 17,920 with Mamba states, 24,576 with windows; "
        "0: no floor)",
    )
    p.add_argument(
        "--tuning",
        action="append",
        metavar="KEY=VALUE",
        help="hybrid: override fitted numbers or switch a learner off, e.g. floor_ratio=16 or "
        "learn_returning=off (repeatable or comma-separated; names: hybridkv.policy.tuning)",
    )
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="hit rate against memory, per policy")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _links(field: str) -> str:
    """``h100 55 GB/s, ...``: one copy link's bandwidth in every device profile."""
    return ", ".join(f"{name} {getattr(d, field) / 1e9:g} GB/s" for name, d in DEVICES.items())


def _int(text: str | None, flag: str, minimum: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise ValueError(f"{flag} must be an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"{flag} must be an integer >= {minimum}, got {value}")
    return value


def _items(text: str, flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ValueError(f"{flag} has an empty entry in {text!r}")
    return items


def _active_params(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--active-params must be a number > 0, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"--active-params must be a number > 0, got {text!r}")
    return value


def _knobs(text: str | None, flag: str) -> list[float | None]:
    """A ``hybrid`` knob's comma list of numbers >= 0 ([None]: not given)."""
    if text is None:
        return [None]
    values: list[float | None] = []
    for item in _items(text, flag):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{flag} must be finite numbers >= 0, got {item!r}") from None
        if not (value >= 0 and value != float("inf")):
            raise ValueError(f"{flag} must be finite numbers >= 0, got {item!r}")
        values.append(value)
    return values


def _tier_sizes(text: str | None, flag: str) -> list[int | None]:
    """A tier flag's comma list of sizes ([None]: not given)."""
    if text is None:
        return [None]
    items = _items(text, flag)
    try:
        return [parse_memory(t) for t in items]
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def _output_tokens(text: str) -> int | None:
    return None if text == "trace" else _int(text, "--output-tokens")


def _prepare(
    args: argparse.Namespace,
) -> tuple[ModelLayout, list[TraceRequest], CostModel, list[SimOptions]]:
    """Check everything and return (layout, requests, cost model, one options per run)."""
    # Imported here, for import weight only: ``hybridkv --help`` registers this command
    # without loading the scheduler and the layouts (pydantic).
    from hybridkv.report.resolve import resolve_layout
    from hybridkv.sim.replay import plan_replay, replay_max_model_len

    budgets = [parse_memory(m) for m in _items(args.memory, "--memory")]
    policies = _items(args.policy, "--policy")
    hosts = _tier_sizes(args.host_memory, "--host-memory")
    if args.disk is not None and "," in args.disk:
        raise ValueError(f"--disk takes one size, got {args.disk!r}")
    (disk,) = _tier_sizes(args.disk, "--disk")
    if args.disk is not None and args.host_memory is None:
        raise ValueError("--disk is the tier below the host: give --host-memory too")
    if args.preemption_mode == "swap" and args.host_memory is None:
        raise ValueError("--preemption-mode swap needs a host tier to swap to: give --host-memory")
    if args.plot and args.host_memory is not None and len(set(hosts)) < 2:
        raise ValueError(
            "--plot draws hit rate against host memory: give --host-memory at least 2 sizes"
        )
    if args.plot and args.host_memory is None and len(set(budgets)) < 2:
        raise ValueError("--plot draws hit rate against memory: give --memory at least 2 budgets")
    common = {
        "max_num_seqs": _int(args.max_num_seqs, "--max-num-seqs"),
        "max_num_batched_tokens": _int(args.max_num_batched_tokens, "--max-num-batched-tokens"),
        "block_size": _int(args.block_size, "--block-size"),
        "arrivals": args.arrivals,
        "max_model_len": _int(args.max_model_len, "--max-model-len"),
        "hash_algo": args.hash_algo,
        "disk_bytes": disk,
        "preemption_mode": args.preemption_mode,
    }
    bonuses = _knobs(args.return_bonus, "--return-bonus")
    grades: list[str | None] = [None]
    if args.return_grade is not None:
        grades = list(_items(args.return_grade, "--return-grade"))
    for grade in grades:
        if grade is not None:
            check_return_grade(grade, "--return-grade")
    weights = _knobs(args.value_weight, "--value-weight")
    floors: list[int | None] = (
        [None]
        if args.floor_tokens is None
        else [
            _int(f, "--floor-tokens", minimum=0)
            for f in _items(args.floor_tokens, "--floor-tokens")
        ]
    )
    tuning = None
    if args.tuning:
        items = parse_tuning(args.tuning)
        DEFAULT_TUNING.with_text(items)  # every name and value checked here
        tuning = ",".join(f"{k}={v}" for k, v in items.items())
    for flag, given in (
        ("--tuning", tuning),
        ("--return-bonus", args.return_bonus),
        ("--return-grade", args.return_grade),
        ("--value-weight", args.value_weight),
        ("--floor-tokens", args.floor_tokens),
    ):
        if given is not None and "hybrid" not in policies:
            raise ValueError(f"{flag} tunes the hybrid policy: add hybrid to --policy")
    runs = [
        SimOptions(
            memory_bytes=b,
            policy=p,
            return_bonus=r,
            return_grade=g,
            value_weight=w,
            floor_tokens=f,
            tuning=tuning if p == "hybrid" else None,
            host_memory_bytes=h,
            **common,
        )
        for b in budgets
        for h in hosts
        for p in policies
        for r, g, w, f in (
            [(r, g, w, f) for r in bonuses for g in grades for w in weights for f in floors]
            if p == "hybrid"
            else [(None, None, None, None)]
        )
    ]
    output_tokens = _output_tokens(args.output_tokens)
    limit = _int(args.requests, "--requests")
    device = device_profile(args.device)
    active = _active_params(args.active_params)
    if args.plot:
        from hybridkv.sim.plot import check_plot_available

        check_plot_available()
    layout = resolve_layout(args.layout)
    cost = CostModel.from_layout(layout, device, active_params_for(layout.name, active))
    requests = load_trace(args.trace, limit=limit, output_tokens=output_tokens)
    max_model_len = replay_max_model_len(layout, requests, runs[0].max_model_len)
    for budget in dict.fromkeys(budgets):  # one plan per budget
        plan_replay(layout, next(o for o in runs if o.memory_bytes == budget), max_model_len)
    return layout, requests, cost, runs


def _write_json(results: list[SimResult], path: str, trace: str) -> None:
    rows = [{"trace": trace, **r.to_json()} for r in results]
    payload: Any = rows[0] if len(rows) == 1 else rows
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
    except OSError as e:
        raise ValueError(f"cannot write --json {path}: {e.strerror or e}") from None


def run_simulate(args: argparse.Namespace) -> int:
    """Run ``hybridkv simulate`` with parsed ``args``; 0 on success, 2 on user errors."""
    try:
        layout, requests, cost, runs = _prepare(args)
        from hybridkv.sim.replay import replay_trace

        results = []
        for options in runs:
            desc = f"{layout.name} {memory_label(options.memory_bytes)} {options.policy_label}"
            if options.host_memory_bytes is not None:
                desc += f" + host {memory_label(options.host_memory_bytes)}"
            results.append(
                replay_trace(
                    layout, requests, options, cost, progress=not args.no_progress, desc=desc
                )
            )
        if args.json:
            _write_json(results, args.json, args.trace)
        if args.plot:
            from hybridkv.sim.plot import save_hit_rate_figure

            title = f"{layout.name}: {len(requests):,} requests of {Path(args.trace).name}"
            save_hit_rate_figure(results, args.plot, title)
    except ValueError as e:
        print(f"hybridkv simulate: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    sys.stdout.write(render_results(results, args.trace))
    for flag, path in (("results", args.json), ("figure", args.plot)):
        if path:
            print(f"{flag} written to {path}")
    return 0
