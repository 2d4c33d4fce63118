#!/usr/bin/env python3
"""The host's share of a decode step, phase by phase, with the model's forward made trivial.

On the fifth lease's H200 a graphed Gemma 3 270M decode step of 64 requests took 2.72 ms of
wall time while the GPU worked 1.14 ms of it (issue 47): the rest is the host's Python
around the replay. This runs ``LLM.generate`` over ``--batch`` prompts of ``--length``
tokens to ``--tokens`` outputs each (greedy, ``ignore_eos``) on a tiny Gemma 3 of 270M's
18 layers and six KV cache groups (5 sliding-window layers to 1 global, block size 16),
with the model's forward replaced by a stub that returns fixed random logits of a
``--vocab`` vocabulary (so the device's work costs nothing here and the argmax is small:
on a GPU both are the device's), on the CPU, eagerly or with ``--graphs`` (the graphed
path: ``StepGraphs`` with the CPU stand-in ``EagerReplay``: ``StaticStep.fill`` and the
replay's bookkeeping run as on a GPU, the captured forward is the stub).

Each phase is measured in **thread CPU time** (``time.thread_time_ns``: time waiting for a
core on a shared machine is left out), exclusive of the phases it calls, per decode step
(every scheduled request one token), as the median over the run's decode steps:

- ``schedule``: ``Scheduler.schedule`` without the manager's calls below;
- ``allocate``: ``KVCacheManager.allocate_slots``;
- ``block ids``: the step's block ids per request (``ModelRunner.block_ids``, or before it
  ``KVCacheManager.get_block_ids`` per request);
- ``inputs``: eager ``ModelRunner.build_batch``; graphed ``StaticStep.fill`` (with its copies);
- ``graph shape``: ``StepGraphs.shape`` (which captured graph a step replays);
- ``forward``: the stub (and, graphed, ``EagerReplay``'s copy of its output): not host work on
  a GPU, shown to be small, left out of ``host``;
- ``sample``: ``sampler.sample`` (argmax, the tokens read back, the per-request draws);
- ``update``: ``Scheduler.update`` (tokens appended, stop checks, finished requests freed);
- ``events``: ``LLM.publish_kv_events``;
- ``step other``: the rest of ``LLM.step`` (and of the runner's ``execute``);
- ``loop``: ``generate``'s own work between two steps (its finished check).

``host`` is the sum of all but ``forward``. ``outputs`` is the time ``generate`` spends
after its last step (building the ``RequestOutput``s; the tiny checkpoint has no tokenizer,
so no detokenisation), once per call, in milliseconds per call.

``--compare TREE`` runs this script alternately against this checkout and another one's
``hybridkv`` (e.g. ``git worktree add --detach /tmp/hs-base main``), ``--rounds`` times each,
every run a fresh process, and prints both tables and their ratios (medians over rounds).

``--async`` runs the engine with ``async_scheduling=True`` (the next step scheduled while
one is in flight). ``--device-ms MS`` gives the stub a **modelled** device
(``model_device.py``: each forward takes MS of "device time" on a FIFO stream while the
host goes on; the host's read of the sampled tokens waits for it), so that a step's
wall time (``LLM.step``'s, median and 10th percentile over the decode steps) shows what
async scheduling overlaps; ``--overlap MS,MS`` runs fresh processes without and with
``--async`` at each modelled time and prints the walls beside ``host + device`` and
``max(host, device)`` (``bench_overlap.py``). A model of a GPU's asynchrony, not a GPU.
``--kv-offloading-size GIB`` puts a host tier under the pool (``--cache-policy``, ``lru``
by default: every computed block written through after its step); the modelled device
counts as a CUDA stream for the tiers (``InFlightStep.stream_ordered``: their copies
queue after its steps, the host does not wait), and the stub writes no KV bytes.

    .venv/bin/python benchmarks/bench_host_step.py [--graphs] [--batch 64] [--length 256]
        [--tokens 128] [--compare /tmp/hs-base --rounds 3] [--json] [--async]
        [--device-ms 1.14] [--overlap 0.3,1.14 --rounds 3] [--kv-offloading-size 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from model_device import ModelDevice  # noqa: E402

PHASES = ("schedule", "allocate", "block ids", "inputs", "graph shape", "forward", "sample",
          "update", "events", "step other", "loop")  # fmt: skip
NOT_HOST = ("forward",)


class Phases:
    """Exclusive thread CPU time per phase: a wrapped call's time, minus that of the
    wrapped calls inside it, goes to its phase. The wrappers' own cost (measured by
    ``calibrate`` on no-op calls: about a microsecond a call on our CPU) is taken off
    each phase for its calls and for the wrapped calls it made."""

    def __init__(self) -> None:
        self.now: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.calls: dict[str, int] = dict.fromkeys(PHASES, 0)  # wrapped calls of the phase
        self.children: dict[str, int] = dict.fromkeys(PHASES, 0)  # wrapped calls it made
        self._stack: list[list[Any]] = []  # per open call: [ns in wrapped calls, phase]
        self.cost_in = self.cost_out = 0.0  # ns a wrapper adds to its call / its caller

    def wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        stack, now, clock = self._stack, self.now, time.thread_time_ns
        calls, children = self.calls, self.children

        def timed(*args: Any, **kwargs: Any) -> Any:
            stack.append([0, phase])
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - t
                inner = stack.pop()[0]
                now[phase] = now.get(phase, 0) + spent - inner
                calls[phase] = calls.get(phase, 0) + 1
                if stack:
                    stack[-1][0] += spent
                    parent = stack[-1][1]
                    children[parent] = children.get(parent, 0) + 1

        return timed

    def calibrate(self, k: int = 2000) -> None:
        """Measure ``cost_in`` and ``cost_out`` on no-op calls (medians of 7)."""

        def noop() -> None:
            return None

        inner = self.wrap(noop, "cal in")
        with_w = self.wrap(lambda: [inner() for _ in range(k)], "cal out")
        without = self.wrap(lambda: [noop() for _ in range(k)], "cal base")
        ins, outs = [], []
        for _ in range(7):
            self.take()
            with_w()
            without()
            ins.append(self.now["cal in"] / k)
            outs.append((self.now["cal out"] - self.now["cal base"]) / k)
        self.cost_in, self.cost_out = statistics.median(ins), statistics.median(outs)
        for d in (self.now, self.calls, self.children):
            for key in ("cal in", "cal out", "cal base"):
                d.pop(key, None)

    def take(self) -> dict[str, float]:
        """Each phase's corrected ns since the last ``take``; resets the counts."""
        out = {
            p: v - self.calls.get(p, 0) * self.cost_in - self.children.get(p, 0) * self.cost_out
            for p, v in self.now.items()
        }
        for d in (self.now, self.calls, self.children):
            for k in d:
                d[k] = 0
        return out


class StubForward:
    """A model whose forward costs nothing: hidden ``[tokens, 1]``, and logits the first
    rows of a fixed random ``[rows, vocab]`` table (each row's argmax its own token)."""

    supports_cuda_graphs = True

    def __init__(self, vocab: int, rows: int, device: ModelDevice | None = None) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.logits = torch.randn(rows, vocab, generator=g)
        self.device = device  # a modelled device's launch per forward (``--device-ms``)

    def __call__(self, batch: Any) -> Any:
        if self.device is not None:
            self.device.launch()
        return batch.positions[:, None].float()

    def compute_logits(self, hidden: Any) -> Any:
        return self.logits[: hidden.shape[0]]


def _checkpoint(out: Path, vocab: int) -> Path:
    sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "engine")]
    from tiny_checkpoints import gemma3_config, save_checkpoint

    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    config = gemma3_config(vocab_size=vocab, num_hidden_layers=18, sliding_window=512,
                           layer_types=kinds, max_position_embeddings=4096)  # fmt: skip
    return save_checkpoint(config, out)


def instrument(llm: Any, phases: Phases, graphs: bool, device: ModelDevice | None = None) -> None:
    """Wrap the engine's parts (instances where the engine calls them on an instance,
    classes and module names otherwise); works on this tree and on older ones."""
    import hybridkv.engine as engine_pkg
    from hybridkv.engine import sampler

    sched, runner, manager = llm.scheduler, llm.runner, llm.manager
    sched.schedule = phases.wrap(sched.schedule, "schedule")
    sched.update = phases.wrap(sched.update, "update")
    manager.allocate_slots = phases.wrap(manager.allocate_slots, "allocate")
    manager.get_block_ids = phases.wrap(manager.get_block_ids, "block ids")
    if hasattr(runner, "block_ids"):  # StepBlockIds (since 2026-11-28), else the manager's
        runner.block_ids = phases.wrap(runner.block_ids, "block ids")
    runner.build_batch = phases.wrap(runner.build_batch, "inputs")
    runner.model = StubForward(llm.text_config.vocab_size, llm.scheduler.max_num_seqs + 1, device)
    forward = runner.model
    forward.__class__.__call__ = phases.wrap(StubForward.__call__, "forward")  # type: ignore[method-assign]
    llm.publish_kv_events = phases.wrap(llm.publish_kv_events, "events")
    original = sampler.sample
    wrapped_sample = phases.wrap(original, "sample")
    if device is not None:  # the sampled tokens' read waits for the modelled device
        timed_sample = wrapped_sample

        def wrapped_sample(*args: Any, **kwargs: Any) -> Any:
            device.drain()
            return timed_sample(*args, **kwargs)

        if llm.async_steps is not None:  # an overlapped step's read waits at its fence
            llm.async_steps.record = device.fence
        if llm.tiers is not None:  # a CUDA stream: the tiers' copies queue after its steps
            llm.tiers.inflight.stream_ordered = True
    for name, mod in list(sys.modules.items()):  # every engine module that imported it
        if name.startswith(engine_pkg.__name__) and getattr(mod, "sample", None) is original:
            mod.sample = wrapped_sample  # type: ignore[attr-defined]
    if graphs:
        from hybridkv.engine.graphs import EagerReplay, StaticStep, StepGraphs

        StaticStep.fill = phases.wrap(StaticStep.fill, "inputs")  # type: ignore[method-assign]
        EagerReplay.replay = phases.wrap(EagerReplay.replay, "forward")  # type: ignore[method-assign]
        runner.graphs = StepGraphs(runner, sched.max_num_seqs, llm.max_model_len,
                                   graph_factory=EagerReplay)  # fmt: skip
        runner.graphs.shape = phases.wrap(runner.graphs.shape, "graph shape")
    step = phases.wrap(llm.step, "step other")
    phases.decode_steps: list[dict[str, float]] = []  # type: ignore[attr-defined]
    phases.steps = 0  # type: ignore[attr-defined]
    phases.walls: list[float] = []  # type: ignore[attr-defined]
    last = [0]

    def timed_step() -> Any:
        t = time.thread_time_ns()
        if last[0]:
            phases.now["loop"] += t - last[0]
        wall = time.perf_counter()
        out = step()
        wall = time.perf_counter() - wall
        per = phases.take()
        phases.steps += 1  # type: ignore[attr-defined]
        if out.scheduled and all(s.num_tokens == 1 for s in out.scheduled):
            phases.decode_steps.append(per)  # type: ignore[attr-defined]
            phases.walls.append(wall)  # type: ignore[attr-defined]
        last[0] = time.thread_time_ns()
        return out

    llm.step = timed_step
    phases.last_step_end = last  # type: ignore[attr-defined]


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One measured ``generate``: per-phase medians (ms per decode step) and more."""
    import torch

    from hybridkv.engine import LLM, SamplingParams

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="host-step-") as tmp:
        model = _checkpoint(Path(tmp) / "ckpt", args.vocab)
        length = args.length + args.tokens + 16
        extra: dict[str, Any] = {"async_scheduling": True} if args.async_scheduling else {}
        if args.kv_offloading_size:
            extra["kv_offloading_size"] = args.kv_offloading_size
            extra["cache_policy"] = args.cache_policy
        llm = LLM(str(model), device="cpu", dtype="float32", kernel_backend="torch",
                  max_num_seqs=args.batch, max_model_len=length, **extra)  # fmt: skip
    phases = Phases()
    phases.calibrate()
    device = ModelDevice(args.device_ms / 1e3) if args.device_ms else None
    instrument(llm, phases, args.graphs, device)
    prompts = [
        {"prompt_token_ids": [(7 * i + j) % (args.vocab - 3) + 3 for j in range(args.length)]}
        for i in range(args.batch)
    ]
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    phases.decode_steps.clear()  # type: ignore[attr-defined]
    phases.walls.clear()  # type: ignore[attr-defined]
    phases.last_step_end[0] = 0  # type: ignore[attr-defined]
    phases.take()
    wall = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    end = time.thread_time_ns()
    wall = time.perf_counter() - wall
    assert all(len(o.outputs[0].token_ids) == args.tokens for o in outs)
    steps: list[dict[str, float]] = phases.decode_steps  # type: ignore[attr-defined]
    med = {p: statistics.median(s[p] for s in steps) / 1e6 for p in PHASES}
    host = [sum(v for p, v in s.items() if p not in NOT_HOST) / 1e6 for s in steps]
    total = [sum(s.values()) / 1e6 for s in steps]
    return {
        "phases": med,
        "host": statistics.median(host),
        "total": statistics.median(total),
        "decode_steps": len(steps),
        "outputs": (end - phases.last_step_end[0]) / 1e6,  # type: ignore[attr-defined]
        "wall_s": wall,
        "graphs": args.graphs,
        "replays": dict(llm.runner.graphs.stats) if llm.runner.graphs is not None else {},
        "tokens": [o.outputs[0].token_ids[:8] for o in outs[:4]],
        "wrapper_ns": [phases.cost_in, phases.cost_out],
        "wall": statistics.median(phases.walls) * 1e3,  # type: ignore[attr-defined]
        # The 10th percentile: a shared machine's contention only ever adds to a step's wall.
        "wall_p10": statistics.quantiles(phases.walls, n=10)[0] * 1e3,  # type: ignore[attr-defined]
        "async": dict(llm.async_steps.stats) if llm.async_steps is not None else None,
        "tier_stores": llm.tiers.stats.written_through if llm.tiers is not None else None,
    }


def _table(results: list[tuple[str, dict[str, Any]]]) -> list[str]:
    heads = [name for name, _ in results]
    lines = ["| phase (ms per decode step) | " + " | ".join(heads) + " |",
             "| --- |" + " ---: |" * len(heads)]  # fmt: skip
    for p in (*PHASES, "host", "total"):
        cells = [r["phases"][p] if p in PHASES else r[p] for _, r in results]
        label = f"**{p}**" if p in ("host", "total") else p
        lines.append(f"| {label} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    lines.append("| outputs (ms per call) | "
                 + " | ".join(f"{r['outputs']:.2f}" for _, r in results) + " |")  # fmt: skip
    return lines


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Alternate fresh processes of this tree and ``args.compare``'s ``hybridkv``."""
    sys.path.insert(0, str(HERE))
    from machine_info import cpu_features, machine

    trees = {"base": Path(args.compare).resolve(), "new": HERE.parent}
    rest = [a for a in argv if a not in ("--compare", args.compare)]
    rest = [a for i, a in enumerate(rest) if not (a == "--rounds" or rest[i - 1] == "--rounds")]
    from tree_runs import alternate

    def note(r: int, name: str, res: dict[str, Any]) -> None:
        print(f"round {r + 1} {name}: host {res['host']:.3f} ms", file=sys.stderr)

    runs = alternate(Path(__file__).resolve(), trees, rest, args.rounds, note)
    if runs["base"][0]["tokens"] != runs["new"][0]["tokens"]:
        raise SystemExit("the two trees generated different tokens")
    merged = []
    for name in trees:
        rs = runs[name]
        merged.append((name, {
            "phases": {p: statistics.median(r["phases"][p] for r in rs) for p in PHASES},
            **{k: statistics.median(r[k] for r in rs) for k in ("host", "total", "outputs")},
        }))  # fmt: skip
    base, new = merged[0][1], merged[1][1]
    load = os.getloadavg()
    print(f"{machine()}; {cpu_features()}; load average {load[0]:.1f} {load[1]:.1f}; "
          f"{'graphed' if args.graphs else 'eager'} decode, {args.batch} x {args.length} -> "
          f"{args.tokens}, stub vocabulary {args.vocab}; base {trees['base']}; medians of "
          f"{args.rounds} alternating runs of {runs['new'][0]['decode_steps']} decode "
          "steps")  # fmt: skip
    print()
    print("\n".join(_table(merged)))
    print()
    print(f"host per decode step: {base['host']:.3f} -> {new['host']:.3f} ms "
          f"({base['host'] / new['host']:.2f}x)")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", action="store_true", help="the graphed path (EagerReplay)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=512, help="the stub's logits' width")
    ap.add_argument("--compare", help="another checkout's root: alternate runs with it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one run's result as JSON")
    ap.add_argument("--async", dest="async_scheduling", action="store_true",
                    help="LLM(async_scheduling=True)")  # fmt: skip
    ap.add_argument("--device-ms", type=float, default=0.0,
                    help="a MODELLED device taking this long a step (model_device.py)")  # fmt: skip
    ap.add_argument("--kv-offloading-size", type=float, default=0.0,
                    help="GiB: a host tier under the pool (0: none)")  # fmt: skip
    ap.add_argument("--cache-policy", default="lru", help="with a host tier: lru writes through")
    ap.add_argument(
        "--overlap",
        metavar="MS,MS",
        help="modelled device times: wall per step without and with --async",
    )
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args, argv)
    if args.overlap:
        from bench_overlap import overlap

        return overlap(args, argv, HERE)
    result = run_once(args)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(_table([("this tree", result)])))
        print(f"{result['decode_steps']} decode steps, wall {result['wall_s']:.2f} s "
              f"({result['wall']:.3f} ms a decode step); graphs: {result['replays']}; async: "
              f"{result['async']}; wrapper ns in/out {result['wrapper_ns']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
