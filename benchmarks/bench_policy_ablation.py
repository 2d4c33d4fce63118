#!/usr/bin/env python3
"""Ablation of the ``hybrid`` policy's online learners (issue 43, part 4).

For four workloads, four layouts and two budgets each, the token hit rate of
``lru``, of ``hybrid`` with every learner on, and of ``hybrid`` with one learner
off (``HybridTuning``'s ``learn_*`` switches, ``--tuning learn_x=off``):

- ``conversation``: the first ``--conversation-requests`` of the Mooncake
  conversation trace;
- ``synthetic``: the first ``--synthetic-requests`` of the Mooncake synthetic trace
  (all 3,993 by default);
- ``mrqa``: ``multi_round_qa.py``'s multi-round QA workload (``--mrqa-users``,
  ``--mrqa-requests``, seed 0);
- ``multiturn``: ``multiturn.py``'s chat workload in the shape of SGLang's
  ``bench_multiturn`` (``--multiturn-requests``, seed 0).

Every replay is ``hybridkv simulate``'s (``replay_trace``): one request at a
time (``max_num_seqs=1``, closed arrivals), one output token, H100 cost model;
hit rates are decisions, not timings, so the machine does not change them.

The rule (issue 43): a learner earns a workload when switching it off loses at
least ``RULE_POINTS`` points of hit rate in at least one of its cells (layout x
budget); a learner that earns fewer than two of the workloads goes. The
summary table shows, per learner and workload, the largest and the smallest
gain (all on minus off) over the cells, and the verdict.

Results go to ``--out`` (markdown) and ``--json`` after every replay, so a
partial run leaves a partial table; a re-run with the same ``--json`` skips the
cells already there if the sizes match (delete it to start over). ``--runs``
picks some of the runs (``lru``, ``hybrid``, ``-x`` for learner ``learn_x`` off,
``+x`` for rule ``x`` on, ``RULES``).

    python benchmarks/bench_policy_ablation.py   # the recorded table (~50 min, loaded 2 cores)
    python benchmarks/bench_policy_ablation.py --conversation-requests 12031 \\
        --out /tmp/ablation-full.md --json /tmp/ablation-full.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from machine_info import machine  # noqa: E402
from multi_round_qa import multi_round_qa  # noqa: E402
from multiturn import multiturn  # noqa: E402

from hybridkv.layouts import shipped_layout  # noqa: E402
from hybridkv.sim import (  # noqa: E402
    CostModel,
    SimOptions,
    active_params_for,
    device_profile,
    replay_trace,
)
from hybridkv.sim.trace import TraceRequest, load_trace  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
#: The learner switches of ``HybridTuning``, in the order the table shows them.
LEARNERS = (
    "learn_tail_alignment",
    "learn_fine_alignment",
    "learn_returning",
    "learn_return_rates",
    "learn_reuse_horizon",
)
#: Switches of ``HybridTuning`` for a rule measured and not adopted (off by
#: default): the ``+x`` run turns it on; shown in the hit-rate table, not judged
#: by the learners' rule.
RULES = ("charge_tail_pages",)
#: The runs of one cell: label -> (policy, tuning text or None).
RUNS: dict[str, tuple[str, str | None]] = {
    "lru": ("lru", None),
    "hybrid": ("hybrid", None),
    **{f"-{name.removeprefix('learn_')}": ("hybrid", f"{name}=off") for name in LEARNERS},
    **{f"+{name}": ("hybrid", f"{name}=on") for name in RULES},
}
#: Corrections: a switch that only scales another learner's answer (off, that
#: learner answers as before; with that learner off it does nothing), so it is
#: judged with the learner it corrects: its own row shows what it adds to it,
#: and it stays or goes with that learner. ``learn_return_rates`` grades
#: ``learn_returning``'s bonus by measured continuation; without it the flat bonus
#: costs the chat workload (``multiturn``) up to 8 points.
CORRECTIONS = {"learn_return_rates": "learn_returning"}
#: Points of hit rate a learner must add on a workload to earn it.
RULE_POINTS = 0.5
#: Workloads a learner must earn to stay.
RULE_WORKLOADS = 2
#: Layouts: two Mamba (Mamba 1 with a 16-token step, Mamba 2 with a 528-token
#: one), one sliding-window, one chunked.
LAYOUTS = ("jamba-v0.1", "bamba-9b", "gemma-3-12b", "llama-4-scout")
#: (tight, roomier) budgets in GB per workload and layout (how chosen: the results page).
BUDGETS: dict[str, dict[str, tuple[int, int]]] = {
    "conversation": {name: (40, 80) for name in LAYOUTS},
    "synthetic": {name: (40, 80) for name in LAYOUTS},
    "mrqa": {
        "jamba-v0.1": (4, 8),
        "bamba-9b": (4, 8),
        "gemma-3-12b": (20, 40),
        "llama-4-scout": (8, 16),
    },
    "multiturn": {
        "jamba-v0.1": (4, 8),
        "bamba-9b": (4, 8),
        "gemma-3-12b": (40, 80),
        "llama-4-scout": (32, 64),
    },
}
WORKLOADS = tuple(BUDGETS)


@dataclass(frozen=True)
class Cell:
    """One (workload, layout, budget) of the table."""

    workload: str
    layout: str
    gb: int

    @property
    def key(self) -> str:
        return f"{self.workload}|{self.layout}|{self.gb}"


def load_workload(name: str, args: argparse.Namespace) -> list[TraceRequest]:
    """The requests of workload ``name`` at the sizes ``args`` set."""
    if name == "mrqa":
        return multi_round_qa(args.mrqa_users, args.mrqa_requests, 0)
    if name == "multiturn":
        return multiturn(requests=args.multiturn_requests, seed=0)
    limit = args.conversation_requests if name == "conversation" else args.synthetic_requests
    return load_trace(TRACES / f"mooncake_{name}.jsonl", limit=limit, output_tokens=1)


def replay_rate(layout_name: str, gb: int, run: str, requests: Sequence[TraceRequest]) -> float:
    """Token hit rate (0-1) of run ``run`` (a ``RUNS`` label) at ``gb`` GB."""
    policy, tuning = RUNS[run]
    layout = shipped_layout(layout_name)
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params_for(layout.name))
    options = SimOptions(
        memory_bytes=gb * 10**9,
        policy=policy,
        max_num_seqs=1,
        arrivals="closed",
        tuning=tuning,
        # The longest request (the replay's default), also where it is longer than
        # the layout's own max_model_len (a few synthetic prompts for Gemma 3).
        max_model_len=max(r.num_tokens for r in requests),
    )
    return replay_trace(layout, requests, options, cost).token_hit_rate


def points(share: float) -> float:
    """A share (0-1) in points of hit rate, rounded to 0.01 (no ``-0.00``)."""
    return round(100 * share, 2) + 0.0


def gains(results: dict[str, dict[str, float]], learner: str, workload: str) -> list[float]:
    """All-on minus ``learner``-off, in points, over the workload's finished cells."""
    run = f"-{learner.removeprefix('learn_')}"
    return [
        points(rates["hybrid"] - rates[run])
        for key, rates in results.items()
        if key.split("|")[0] == workload and "hybrid" in rates and run in rates
    ]


def render(results: dict[str, dict[str, float]], args: argparse.Namespace, done: bool) -> str:
    """The markdown page: sizes, the hit-rate table, the per-learner summary."""
    sizes = (
        f"conversation: first {args.conversation_requests:,} requests; synthetic: first "
        f"{args.synthetic_requests:,}; mrqa: {args.mrqa_users} users, "
        f"{args.mrqa_requests:,} requests, seed 0; multiturn: "
        f"{args.multiturn_requests:,} requests, seed 0"
    )
    runs = list(RUNS)
    lines = [
        "## Hit rate per learner switched off",
        "",
        f"{sizes}. One request at a time, one output token, H100 cost model "
        f"(`bench_policy_ablation.py`; {machine()}).",
        "" if done else "**Partial: the run is going on or stopped; missing cells are absent.**",
        "",
        "Token hit rates in %; the `-x` columns are `hybrid` with learner `learn_x` off, and "
        "in brackets the loss against all learners on (points; negative: off hits more); "
        "a `+x` column is `hybrid` with the rule `x` on, and in brackets its gain.",
        "",
        "| workload | layout | budget | " + " | ".join(runs) + " |",
        "| --- | --- | ---: | " + " | ".join("---:" for _ in runs) + " |",
    ]
    for workload in WORKLOADS:
        for layout in LAYOUTS:
            for gb in BUDGETS[workload][layout]:
                rates = results.get(Cell(workload, layout, gb).key)
                if not rates:
                    continue
                row = []
                for run in runs:
                    if run not in rates:
                        row.append("")
                    elif run[0] in "-+" and "hybrid" in rates:
                        diff = points(rates["hybrid"] - rates[run])
                        diff = diff if run[0] == "-" else -diff + 0.0
                        row.append(f"{100 * rates[run]:.2f} ({diff:+.2f})")
                    else:
                        row.append(f"{100 * rates[run]:.2f}")
                lines.append(f"| {workload} | {layout} | {gb} GB | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Gain of each learner (all on minus that one off), points of hit rate",
        "",
        f"Per workload: the largest and the smallest gain over its cells (layout x budget). "
        f"A workload is earned when the largest gain is at least {RULE_POINTS} points; "
        f"the rule keeps a learner that earns at least {RULE_WORKLOADS} of the "
        f"{len(WORKLOADS)} workloads. A correction (a switch that only scales another "
        f"learner's answer: {', '.join(f'`{c}` of `{p}`' for c, p in CORRECTIONS.items())}) "
        "is judged with the learner it corrects: its row is what it adds to that learner.",
        "",
        "| learner | " + " | ".join(WORKLOADS) + " | earned | rule |",
        "| --- | " + " | ".join("---" for _ in WORKLOADS) + " | ---: | --- |",
    ]
    verdicts: dict[str, str] = {}
    for learner in LEARNERS:
        cols, earned, seen = [], 0, 0
        for workload in WORKLOADS:
            g = gains(results, learner, workload)
            if not g:
                cols.append("")
                continue
            seen += 1
            earned += max(g) >= RULE_POINTS
            cols.append(f"max {max(g):+.2f}, min {min(g):+.2f} ({len(g)} cells)")
        verdict = "stays" if earned >= RULE_WORKLOADS else "goes"
        parent = CORRECTIONS.get(learner)
        if parent is not None and parent in verdicts:
            verdict = f"{verdicts[parent]} with `{parent}` (corrects it)"
        if seen < len(WORKLOADS):
            verdict += " (partial)"
        verdicts[learner] = verdict
        lines.append(f"| `{learner}` | " + " | ".join(cols) + f" | {earned} | {verdict} |")
    return "\n".join(lines) + "\n"


def sizes_of(args: argparse.Namespace) -> dict[str, int]:
    """The workload sizes of a run (a saved ``--json`` is reused only at the same sizes)."""
    names = (
        "conversation_requests",
        "synthetic_requests",
        "mrqa_users",
        "mrqa_requests",
        "multiturn_requests",
    )
    return {name: getattr(args, name) for name in names}


def write(results: dict[str, dict[str, float]], args: argparse.Namespace, done: bool) -> None:
    saved = {"sizes": sizes_of(args), "results": results}
    args.json.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    table = render(results, args, done)
    text = args.out.read_text() if args.out.exists() else ""
    start, end = "<!-- ablation table: start -->", "<!-- ablation table: end -->"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + start + "\n" + table + end + rest.split(end, 1)[1]
    else:
        text = f"# `hybrid` policy: learner ablation\n\n{start}\n{table}{end}\n"
    args.out.write_text(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversation-requests", type=int, default=3000)
    ap.add_argument("--synthetic-requests", type=int, default=3993)
    ap.add_argument("--mrqa-users", type=int, default=64)
    ap.add_argument("--mrqa-requests", type=int, default=1000)
    ap.add_argument("--multiturn-requests", type=int, default=2000)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--runs", default=",".join(RUNS), help="some of: " + ", ".join(RUNS))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "policy-ablation.md")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "policy-ablation.json")
    args = ap.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    if args.json.exists():
        saved = json.loads(args.json.read_text())
        if saved["sizes"] != sizes_of(args):
            raise SystemExit(
                f"{args.json} holds results at sizes {saved['sizes']}, not {sizes_of(args)}: "
                "pass another --json, or delete it to start over"
            )
        results = saved["results"]
    runs = args.runs.split(",")
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        raise SystemExit(f"--runs: unknown {', '.join(unknown)}; known: {', '.join(RUNS)}")
    for workload in args.workloads.split(","):
        if workload not in BUDGETS:
            raise SystemExit(f"--workloads: unknown {workload!r}; known: {', '.join(WORKLOADS)}")
        requests = load_workload(workload, args)
        for layout in args.layouts.split(","):
            for gb in BUDGETS[workload][layout]:
                rates = results.setdefault(Cell(workload, layout, gb).key, {})
                for run in runs:
                    if run in rates:
                        continue
                    t = time.perf_counter()
                    rates[run] = replay_rate(layout, gb, run, requests)
                    print(
                        f"{workload} {layout} {gb} GB {run}: {100 * rates[run]:.2f} % "
                        f"({time.perf_counter() - t:.1f} s)",
                        flush=True,
                    )
                    write(results, args, done=False)
    write(results, args, done=True)


if __name__ == "__main__":
    main()
