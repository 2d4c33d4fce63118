#!/usr/bin/env python3
"""Is a decode step launch-bound? Where one engine step's time goes (issue 16: "use CUDA
graphs for decode steps if the step is launch-bound; measure first").

Runs ``--batch`` requests (``--length``-token prompts) until all decode, then
times ``--steps`` decode steps, each split into:

- ``schedule``: the scheduler and the KV cache manager (Python, CPU);
- ``batch``: building the step's tensors (block tables, slots, positions);
- ``model``: the forward pass and logits, to the point the sampled tokens are
  back on the host (``sample`` reads them: the step's only sync);
- ``update``: appending tokens, freeing finished requests.

On CUDA it also profiles as many further steps with ``torch.profiler`` and reports
per step the GPU's busy time (kernel time summed), the kernels the GPU ran, and the
launches the host made (kernel launch calls of the CUDA runtime and driver, and graph
launches). A step whose GPU busy time is well under its model time is bound by the
host (Python and the CUDA driver); CUDA graphs remove the launches, not the rest.

With ``--cuda-graphs`` a replayed step's ``batch`` is ``StaticStep.fill`` (writing the
step's ids, positions, slots and block tables into the graph's tensors, on the host,
and their upload) and its ``model`` the replay to the logits being ready; the output
says how many of the timed and of the profiled steps were replays, and on CUDA a
replay's GPU time between two CUDA events (its kernels and the gaps between them).
Kernels run from a graph count as kernels the GPU ran (CUPTI reports each), not as
launches:
before 2026-11-27 the table called the GPU's kernels "launches", which read as
289 launches per replayed step on the H100 lease. Without CUDA, ``--cuda-graphs``
installs the CPU tests' stand-in (``EagerReplay``): a check of the code path, no timing.

    python3 research/step_profile.py [--model DIR] [--dtype bfloat16] [--batch 64]
        [--length 256] [--steps 32] [--kernel-backend triton] [--cuda-graphs
        [--graph-min-span N]] [--programs-per-sm N] [--write]

``--graph-min-span`` sets the graphs' smallest span class (``MIN_SPAN``, 512 keys; 2,048
before 2026-11-28): decode attention in a graph plans its launch for the span class,
not the step's contexts. A span class never exceeds ``max_model_len``, which this
script sets to ``--length + 3 x --steps + 64`` (416 at the defaults): there every class
is 416 and the flag changes nothing; Gemma 3's head of 256 takes tiles of 32 keys at
any span anyway (``decode-attention-bytes.md``).

``--programs-per-sm`` sets the attention launcher's fill rule
(``launch_rules.PROGRAMS_PER_SM``, 2): a decode launch of fewer programs splits KV
until it has about that many per SM; 0 turns the rule off (the launches before
2026-11-28: one program per sequence and KV head below 2,048 keys).

``--write`` saves ``benchmarks/results/step-profile-<device>-<dtype>[-random][-graphs][-spanN]
[-fillN].md``
(``-random``: ``--random-weights``, the model's shape with random weights).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]

PARTS = ("schedule", "batch", "model", "update")
#: Host calls that launch work on the GPU (runtime and driver API names, as the
#: profiler records them; Triton launches through the driver).
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")


class StepTimer:
    """Wraps an ``LLM``'s scheduler and runner to time each part of its steps."""

    def __init__(self, llm: Any, sync: Callable[[], None]) -> None:
        self.times: dict[str, list[float]] = {p: [] for p in PARTS}
        self.on = False
        self._sync = sync
        sched, runner = llm.scheduler, llm.runner
        self._wrap(sched, "schedule", "schedule")
        self._wrap(sched, "update", "update")
        self._wrap(runner, "build_batch", "batch")
        build = runner.build_batch
        model = runner.model
        graphs = runner.graphs
        timer = self
        self._fill = 0.0  # the last StaticStep.fill's seconds
        self._events: tuple[Any, Any] | None = None  # around the last CudaGraph.replay
        self.replay_gpu: list[float] = []  # each timed replay's GPU seconds (CUDA events)
        self.replays = 0  # steps replayed from graphs, timed or not
        self.timed_replays = 0
        if graphs is not None:
            self._wrap_fill()
            if runner.device.type == "cuda":
                self._wrap_replay()

        def execute(work: Any) -> torch.Tensor:
            if graphs is not None:  # a replay: fill is the batch's time, the rest the model's
                timer._fill = 0.0
                t = time.perf_counter()
                logits = graphs.run(work)
                if logits is not None:
                    timer._sync()
                    timer.replays += 1
                    if timer.on:
                        timer.timed_replays += 1
                        if timer._events is not None:
                            start, end = timer._events
                            timer.replay_gpu.append(start.elapsed_time(end) / 1e3)
                        timer.times["batch"].append(timer._fill)
                        timer.times["model"].append(time.perf_counter() - t - timer._fill)
                    return logits
            batch = build(work)
            t = time.perf_counter()
            with torch.inference_mode():
                hidden = model(batch)
                logits = model.compute_logits(hidden[batch.logits_indices])
            timer._sync()
            if timer.on:
                timer.times["model"].append(time.perf_counter() - t)
            return logits

        runner.execute = execute

    def _wrap_fill(self) -> None:
        """Time ``StaticStep.fill`` (every graph's; the class is patched for this run)."""
        from hybridkv.engine.graphs.static_step import StaticStep

        fill = StaticStep.fill
        timer = self

        def timed_fill(static: Any, *args: Any, **kwargs: Any) -> int:
            t = time.perf_counter()
            out = fill(static, *args, **kwargs)
            timer._fill = time.perf_counter() - t
            return out

        StaticStep.fill = timed_fill  # type: ignore[method-assign]

    def _wrap_replay(self) -> None:
        """CUDA events around every ``CudaGraph.replay`` (the class is patched for this
        run): the GPU's time from the replay's first kernel to its last, gaps included."""
        from hybridkv.engine.graphs.capture import CudaGraph

        replay = CudaGraph.replay
        timer = self

        def timed_replay(graph: Any) -> None:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            replay(graph)
            end.record()
            timer._events = (start, end)

        CudaGraph.replay = timed_replay  # type: ignore[method-assign]

    def _wrap(self, obj: Any, name: str, part: str) -> None:
        fn = getattr(obj, name)
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            if timer.on:
                timer.times[part].append(time.perf_counter() - t)
            return out

        setattr(obj, name, timed)


def decode_steps(llm: Any, prompts: list[list[int]], steps: int, timer: StepTimer) -> float:
    """Admit ``prompts``, run until all decode, then ``steps`` timed decode steps;
    returns their mean wall seconds."""
    from hybridkv.engine import SamplingParams
    from hybridkv.engine.engine_request import EngineRequest

    params = SamplingParams(max_tokens=10**6, ignore_eos=True)
    for i, p in enumerate(prompts):
        llm.scheduler.add_request(
            EngineRequest(f"p{i}", p, params, max_model_len=llm.max_model_len)
        )
    while any(r.num_output_tokens == 0 for r in llm.scheduler.running) or llm.scheduler.waiting:
        llm.step()
    for _ in range(3):
        llm.step()  # warm-up decodes
    timer.on = True
    t = time.perf_counter()
    for _ in range(steps):
        llm.step()
    wall = (time.perf_counter() - t) / steps
    timer.on = False
    return wall


def launch_counts(events: Any) -> tuple[float, int, int, int]:
    """``(GPU kernel seconds, kernels the GPU ran, host kernel launches, host graph
    launches)`` of profiler ``events`` (``name``, ``device_type``, ``device_time`` in
    microseconds). A kernel replayed from a graph is a GPU kernel, not a host launch."""
    busy, kernels, launches, graph_launches = 0.0, 0, 0, 0
    for e in events:
        if e.device_type == DeviceType.CUDA:
            busy += e.device_time / 1e6
            kernels += 1
        elif e.name.startswith(KERNEL_LAUNCHES):
            launches += 1
        elif e.name.startswith(GRAPH_LAUNCHES):
            graph_launches += 1
    return busy, kernels, launches, graph_launches


def kernels_by_name(events: Any, steps: int, top: int = 25) -> list[str]:
    """Markdown rows: the GPU kernels of ``events`` by name, per step (count and
    microseconds), most time first, the ``top`` first (names cut to 60 characters)."""
    count: dict[str, int] = {}
    time_us: dict[str, float] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA:
            count[e.name] = count.get(e.name, 0) + 1
            time_us[e.name] = time_us.get(e.name, 0.0) + e.device_time
    rows = ["| GPU kernel | per step | us per step |", "| --- | ---: | ---: |"]
    for name in sorted(time_us, key=lambda n: -time_us[n])[:top]:
        short = name if len(name) <= 60 else name[:57] + "..."
        rows.append(f"| `{short}` | {count[name] / steps:.1f} | {time_us[name] / steps:.1f} |")
    return rows


def gpu_profile(llm: Any, steps: int) -> tuple[float, float, float, float, list[str]]:
    """Per step over ``steps`` steps: (GPU kernel seconds, kernels the GPU ran, host
    kernel launches, host graph launches, ``kernels_by_name``'s rows)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            llm.step()
        torch.cuda.synchronize()
    events = prof.events()
    busy, kernels, launches, graphs = launch_counts(events)
    by_name = kernels_by_name(events, steps)
    return busy / steps, kernels / steps, launches / steps, graphs / steps, by_name


def main() -> int:
    from bench_engine import arguments, corpus, model_title, resolve_model

    from hybridkv.engine import LLM

    ap = arguments(__doc__, "bfloat16", "step-profile-<device>-<dtype>[-random][-graphs].md")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument(
        "--graph-min-span",
        type=int,
        default=None,
        help="with --cuda-graphs: the smallest span class a graph plans attention for "
        "(a power of two; default hybridkv.engine.graphs' MIN_SPAN)",
    )
    ap.add_argument(
        "--programs-per-sm",
        type=int,
        default=None,
        help="the decode split-KV's fill rule: programs per SM it fills to (0: off; "
        "default launch_rules.PROGRAMS_PER_SM)",
    )
    args = ap.parse_args()
    if args.programs_per_sm is not None:
        from hybridkv.kernels.attention import launch_rules

        if args.programs_per_sm < 0:
            raise SystemExit("--programs-per-sm: an integer >= 0 (0 turns the fill rule off)")
        launch_rules.PROGRAMS_PER_SM = args.programs_per_sm
    resolve_model(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm = LLM(
        args.model,
        dtype=getattr(torch, args.dtype),
        device=device,
        kernel_backend=args.kernel_backend,
        cuda_graphs=args.cuda_graphs and device == "cuda",
        max_num_seqs=args.batch,
        max_model_len=args.length + 3 * args.steps + 64,
    )
    if args.cuda_graphs and device != "cuda":  # the CPU stand-in: the code path only
        from hybridkv.engine.graphs import EagerReplay, StepGraphs

        llm.runner.graphs = StepGraphs(
            llm.runner, args.batch, llm.max_model_len, graph_factory=EagerReplay
        )
    if args.graph_min_span is not None:
        span = args.graph_min_span
        if not args.cuda_graphs or span < 1 or span & (span - 1):
            raise SystemExit("--graph-min-span: a power of two, with --cuda-graphs")
        assert llm.runner.graphs is not None
        llm.runner.graphs.min_span = span
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    timer = StepTimer(llm, sync)
    text = corpus(llm.tokenizer, args.length + 7 * args.batch)
    prompts = [text[i * 7 : i * 7 + args.length] for i in range(args.batch)]
    wall = decode_steps(llm, prompts, args.steps, timer)
    means = {p: statistics.mean(v) if v else 0.0 for p, v in timer.times.items()}
    graphed = args.cuda_graphs
    span = args.graph_min_span
    span_note = "" if span is None else f" (smallest span class {span})"
    if args.programs_per_sm is not None:
        span_note += f" (split-KV fill rule: {args.programs_per_sm} programs per SM)"
    lines = [f"# Decode step profile: {model_title(args)}, {args.dtype}, {device}", "",
             f"{args.batch} requests decoding ({args.length}-token prompts), {args.steps} steps, "
             f"kernel backend {llm.kernel_backend}"
             f"{', decode steps from CUDA graphs' if graphed else ''}"
             f"{span_note}. "
             "Milliseconds per step"
             f"{' (batch: StaticStep.fill; model: the replay)' if graphed else ''}; "
             "GPU kernels and host launches per step.", "",
             "| step wall | " + " | ".join(PARTS) + " | GPU busy | GPU kernels | host launches |",
             "| ---: | " + " | ".join("---:" for _ in PARTS) + 3 * " ---: |"]  # fmt: skip
    prof = None
    if device == "cuda":
        before = timer.replays
        prof = gpu_profile(llm, args.steps)
        profiled_replays = timer.replays - before
    cells = [f"{wall * 1e3:.2f}", *(f"{means[p] * 1e3:.2f}" for p in PARTS)]
    if prof is None:
        cells += ["-", "-", "-"]
    else:
        busy, kernels, launches, graph_launches, _ = prof
        cells += [
            f"{busy * 1e3:.2f}",
            f"{kernels:.0f}",
            f"{launches:.0f} + {graph_launches:.0f} graph",
        ]
    lines.append("| " + " | ".join(cells) + " |")
    if graphed:
        lines += ["", f"Replayed from graphs: {timer.timed_replays} of the {args.steps} timed steps"
                  + ("" if prof is None else
                     f", {profiled_replays} of the {args.steps} profiled steps") + "."]  # fmt: skip
        if timer.replay_gpu:
            gpu = statistics.mean(timer.replay_gpu)
            lines += ["", f"A timed replay's GPU time (CUDA events around it, gaps between "
                      f"kernels included): {gpu * 1e3:.2f} ms of the model's "
                      f"{means['model'] * 1e3:.2f} ms."]  # fmt: skip
    if prof is not None:
        share = prof[0] / means["model"] if means["model"] else 0.0
        verdict = "launch-bound: CUDA graphs would pay" if share < 0.5 else "GPU-bound"
        if graphed:
            verdict = "still host-bound" if share < 0.5 else "GPU-bound"
        lines += ["", f"GPU busy / model time: {share:.0%} ({verdict}).", "",
                  "The GPU's kernels by name (profiled steps):", "", *prof[4]]  # fmt: skip
    print("\n".join(lines))
    if args.write:
        suffix = "-random" if args.random_weights is not None else ""
        suffix += "-graphs" if graphed else ""
        suffix += "" if args.graph_min_span is None else f"-span{args.graph_min_span}"
        suffix += "" if args.programs_per_sm is None else f"-fill{args.programs_per_sm}"
        out = ROOT / "benchmarks" / "results" / f"step-profile-{device}-{args.dtype}{suffix}.md"
        out.write_text("\n".join(lines) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
