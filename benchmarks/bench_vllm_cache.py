#!/usr/bin/env python3
"""Prefix-cache hit rates side by side with vLLM 0.33's real KVCacheManager (issue 15).

For each layout and memory budget, our planner gives the KV cache config
(``plan_kv_cache`` via ``hybridkv.sim``'s ``plan_replay``: groups, specs,
``num_blocks``). The same config is built in vLLM's classes with vLLM's own
grouping (``vllm_ref.config``), and the first ``--requests`` requests of the
Mooncake trace, expanded as ``hybridkv.sim.trace`` does (each 512-token hash id
to 512 distinct token ids), are replayed one at a time (prompt in chunks of at
most 8,192 tokens, ``--output-tokens`` sampled tokens, free) through:

- vLLM's ``KVCacheManager``, driven as its scheduler drives it (``vllm_ref.replay``;
  for Mamba layouts with its align-mode chunking, junction stops included,
  ``vllm_ref.chunking``), once per ``prefix_cache_retention_interval`` in
  ``--retention`` (``none`` = dense, ``0`` = vLLM's default: only the prompt's
  last aligned state and shared-prefix junctions, ``R`` = also every R tokens);
- ours, live, under each ``--policies`` policy: ``hybridkv simulate LAYOUT
  --max-num-seqs 1 --arrivals closed --output-tokens 1 --memory M --policy P``'s
  own replay (``ours_replay``).

Reported per row: token hit rate (hit tokens at first admission over prompt
tokens), the blocks left in the prefix cache at the end by kind and their
bytes (a block id spans all of a group's layers: ``page_bytes``, the same on
both sides when vLLM groups the layers as we do, which the script checks), and
the largest cached state (the non-full kind) seen, sampled every 10 requests.
vLLM's "best" retention is the one with the highest hit rate (ties: less cached
state). The issue's target is checked on the Mamba layouts: hybrid's hit rate at
least 1.5x vLLM's best, holding less cached state memory than it at the end.

    python benchmarks/bench_vllm_cache.py                       # 1,500 requests, all
    python benchmarks/bench_vllm_cache.py --layouts jamba-v0.1 --memory 40GB
    python benchmarks/bench_vllm_cache.py --write               # -> results/cache-vllm.md

Needs the vLLM baseline (``bash ../shared/bench/vllm_baseline/setup.sh``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from ceilings import belady_hits, block_keys, lru_hits  # noqa: E402
from machine_info import machine  # noqa: E402
from ours_replay import OursResult, closed_options, run_ours  # noqa: E402
from vllm_ref.chunking import vllm_chunk_rule  # noqa: E402
from vllm_ref.config import (  # noqa: E402
    block_sizes,
    check_block_size,
    check_same_grouping,
    to_vllm_config,
)
from vllm_ref.replay import VllmCacheReplay, VllmReplayResult  # noqa: E402
from vllm_ref.source import default_harness, default_vllm_src, load_vllm  # noqa: E402

from hybridkv.layouts import ModelLayout  # noqa: E402
from hybridkv.report.resolve import resolve_layout  # noqa: E402
from hybridkv.report.units import parse_memory  # noqa: E402
from hybridkv.sim import load_trace  # noqa: E402
from hybridkv.sim.model_params import ACTIVE_PARAMS  # noqa: E402
from hybridkv.sim.options import policy_label  # noqa: E402
from hybridkv.sim.replay import plan_replay, replay_max_model_len  # noqa: E402
from hybridkv.sim.table import memory_label  # noqa: E402
from hybridkv.sim.trace import TraceRequest  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
FULL_ONLY = HERE / "layouts" / "llama-3.1-8b.yaml"
DEFAULT_LAYOUTS = f"jamba-v0.1,gemma-3-27b,{FULL_ONLY.relative_to(ROOT)}"
RESULTS = HERE / "results" / "cache-vllm.md"
#: Active parameters of the layouts not in ``hybridkv.sim.model_params`` (cost model only).
EXTRA_ACTIVE_PARAMS = {"llama-3.1-8b": 8.03e9}  # Llama 3.1 model card: 8B
#: Candidate ``prefix_cache_retention_interval``s; positive ones must be multiples
#: of the scheduler block size (80 for jamba-v0.1, 16 for gemma-3-27b): all here are.
DEFAULT_RETENTION = "none,0,160,240,480,800,4000,8160"
TARGET_RATIO = 1.5


@dataclass
class Cell:
    """One layout at one budget: vLLM's runs (by retention) and ours (by policy)."""

    layout: str
    memory_bytes: int
    num_blocks: int
    page_bytes: int
    vllm_page_bytes: int
    block_size: int
    kinds: list[str]
    notes: list[str]
    vllm: dict[str, VllmReplayResult]
    ours: dict[str, OursResult]
    #: ``ceilings``: hit rates with every page full attention (lru, belady).
    ceiling: tuple[float, float] = (0.0, 0.0)

    @property
    def state_kind(self) -> str | None:
        """The kind whose cached memory the target compares (the non-full one)."""
        others = [k for k in self.kinds if k != "full"]
        return others[0] if others else None

    @property
    def has_mamba(self) -> bool:
        return "mamba" in self.kinds

    def best_vllm(self) -> tuple[str, VllmReplayResult]:
        """The retention with the highest hit rate; ties: less cached state."""
        sk = self.state_kind

        def key(item: tuple[str, VllmReplayResult]) -> tuple[int, int]:
            r = item[1]
            return (r.hit_tokens, -(r.cached_blocks.get(sk, 0) if sk else 0))

        return max(self.vllm.items(), key=key)


def retention_values(text: str) -> list[int | None]:
    """``"none,0,800"`` -> ``[None, 0, 800]``."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(None if part == "none" else int(part))
    return out


def retention_label(r: int | None) -> str:
    return "none (dense)" if r is None else f"{r:,}"


def retentions_for(candidates: list[int | None], kinds: list[str], block: int) -> list[int | None]:
    """The candidates vLLM accepts for this config (see ``kv_cache_coordinator``)."""
    if not any(k in ("sliding_window", "mamba") for k in kinds):
        return [0]  # retention only applies to sliding-window and Mamba groups
    return [r for r in candidates if r is None or r % block == 0]


def active_params(layout: ModelLayout) -> float:
    return ACTIVE_PARAMS.get(layout.name) or EXTRA_ACTIVE_PARAMS[layout.name]


def full_attention_ceilings(cfg: Any, requests: Sequence[TraceRequest]) -> tuple[float, float]:
    """Hit rates (lru, belady) with every page of ``cfg`` spent on full attention."""
    (bs,) = {
        g.kv_cache_spec.block_size for g in cfg.kv_cache_groups if g.kv_cache_spec.kind == "full"
    }
    keys = [block_keys(r, bs) for r in requests]
    lengths = [r.input_length for r in requests]
    total = sum(lengths)
    n = cfg.num_blocks
    return lru_hits(keys, lengths, bs, n) / total, belady_hits(keys, lengths, bs, n) / total


def run_cell(vl, layout: ModelLayout, requests, memory: int, args) -> Cell:
    """Every vLLM retention and every policy of ours on one layout and budget."""
    options = closed_options(
        memory, args.policies[0], args.max_num_batched_tokens, args.max_model_len
    )
    mml = replay_max_model_len(layout, requests, args.max_model_len)
    plan = plan_replay(layout, options, mml)
    ours_cfg = plan.kv_cache_config
    kinds = list(dict.fromkeys(g.kv_cache_spec.kind for g in ours_cfg.kv_cache_groups))
    probe = to_vllm_config(ours_cfg, vl, 0)
    notes = [
        n
        for n in (
            check_same_grouping(ours_cfg, probe.kv_cache_groups, vl),
            check_block_size(ours_cfg),
        )
        if n
    ]
    sched_block, hash_block = block_sizes(probe)
    # A vLLM block id spans its largest group's layers (smaller groups are padded).
    groups = probe.kv_cache_groups
    vllm_page = max(len(g.layer_names) for g in groups) * groups[0].kv_cache_spec.page_size_bytes
    cell = Cell(
        layout.name,
        memory,
        ours_cfg.num_blocks,
        plan.page_bytes,
        vllm_page,
        sched_block,
        kinds,
        notes,
        {},
        {},
    )
    if cell.has_mamba:
        cell.ceiling = full_attention_ceilings(ours_cfg, requests)
    rule = vllm_chunk_rule(vl, sched_block, args.max_num_batched_tokens)
    for r in retentions_for(args.retention, kinds, sched_block):
        cfg = to_vllm_config(ours_cfg, vl, r)
        replay = VllmCacheReplay(
            vl,
            cfg,
            max_model_len=mml,
            scheduler_block_size=sched_block,
            hash_block_size=hash_block,
            max_num_batched_tokens=args.max_num_batched_tokens,
            chunk_rule_check=rule if args.check_chunk_rule else None,
        )
        res = replay.run(
            requests,
            sample_every=args.sample_every,
            progress=args.progress,
            desc=f"vLLM {layout.name} {memory_label(memory)} R={r}",
        )
        cell.vllm[retention_label(r)] = res
        print(
            f"  vLLM R={retention_label(r):>12}: hit {100 * res.token_hit_rate:6.2f} %, "
            f"cached {res.cached_blocks}, {res.seconds:.1f} s",
            flush=True,
        )
    batched, mml_arg = args.max_num_batched_tokens, args.max_model_len
    runs = [(p, closed_options(memory, p, batched, mml_arg)) for p in args.policies]
    runs += [
        (
            policy_label("hybrid", None, w),
            replace(closed_options(memory, "hybrid", batched, mml_arg), value_weight=w),
        )
        for w in args.value_weights
    ]
    for label, options in runs:
        res_ours = run_ours(
            layout,
            requests,
            options,
            active_params=active_params(layout),
            sample_every=args.sample_every,
            progress=args.progress,
            desc=f"hybridkv {layout.name} {memory_label(memory)} {label}",
        )
        assert res_ours.sim.num_blocks == cell.num_blocks
        cell.ours[label] = res_ours
        s = res_ours.sim
        print(
            f"  hybridkv {label:>8}: hit {100 * s.token_hit_rate:6.2f} %, "
            f"cached {s.cached_blocks}, {s.replay_seconds:.1f} s",
            flush=True,
        )
    return cell


def _blocks(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in counts.items())


def _gb(counts: dict[str, int], page: int) -> str:
    return ", ".join(f"{k} {n * page / 1e9:.1f}" for k, n in counts.items())


def _state_gb(counts: dict[str, int], kind: str | None, page: int) -> str:
    return "-" if kind is None else f"{counts.get(kind, 0) * page / 1e9:.2f}"


def render_cell(cell: Cell) -> list[str]:
    """The markdown table of one layout and budget."""
    sk = cell.state_kind
    best_r, best = cell.best_vllm()
    default = cell.vllm.get("0")
    mib = cell.page_bytes / 2**20
    if cell.vllm_page_bytes == cell.page_bytes:
        per_block = f"{mib:.2f} MiB per block id on both sides"
    else:
        per_block = f"{mib:.2f} MiB per block id, vLLM's {cell.vllm_page_bytes / 2**20:.2f} MiB"
    lines = [
        f"### {cell.layout} @ {memory_label(cell.memory_bytes)}: {cell.num_blocks:,} blocks "
        f"of {cell.block_size} tokens ({per_block})",
        "",
        "| system | token hit rate | x vLLM best | cached blocks by kind (end) | "
        "cached GB by kind (end) | cached state GB: end / mean under pressure / peak | "
        "replay s |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: |",
    ]

    def row(
        name: str, hit: float, cached: dict, mean: dict, peak: dict, page: int, sec: float
    ) -> None:
        ratio = hit / best.token_hit_rate if best.token_hit_rate else float("nan")
        state = " / ".join(_state_gb(c, sk, page) for c in (cached, mean, peak))
        lines.append(
            f"| {name} | {100 * hit:.2f} % | {ratio:.2f}x | {_blocks(cached)} | "
            f"{_gb(cached, page)} | {state} | {sec:.1f} |"
        )

    vpage = cell.vllm_page_bytes
    if default is not None:
        row(
            "vLLM, retention 0 (default)",
            default.token_hit_rate,
            default.cached_blocks,
            default.pressured_mean_blocks,
            default.peak_cached_blocks,
            vpage,
            default.seconds,
        )
    row(
        f"vLLM, best retention ({best_r})",
        best.token_hit_rate,
        best.cached_blocks,
        best.pressured_mean_blocks,
        best.peak_cached_blocks,
        vpage,
        best.seconds,
    )
    for policy, o in cell.ours.items():
        s = o.sim
        row(
            f"hybridkv {policy}",
            s.token_hit_rate,
            s.cached_blocks,
            o.pressured_mean_blocks,
            o.peak_cached_blocks,
            cell.page_bytes,
            s.replay_seconds,
        )
    lines.append("")
    sweep = ", ".join(f"{r}: {100 * v.token_hit_rate:.2f} %" for r, v in cell.vllm.items())
    lines.append(f"vLLM `prefix_cache_retention_interval` sweep (hit rate): {sweep}.")
    checks = sum(v.chunk_rule_checks for v in cell.vllm.values())
    if cell.has_mamba:
        junctions = ", ".join(f"{r}: {v.junction_chunks:,}" for r, v in cell.vllm.items())
        lines.append(
            f"Chunks ended at a shared-prefix junction: {junctions}; chunk ends checked "
            f"against vLLM's own `_mamba_block_aligned_split`: {checks:,}."
        )
    lines += [f"Note: {n}." for n in cell.notes]
    if cell.kinds == ["full"] and "lru" in cell.ours and "0" in cell.vllm:
        v, o = cell.vllm["0"], cell.ours["lru"].sim
        same = v.hit_tokens == o.hit_tokens and v.cached_blocks == o.cached_blocks
        lines.append(
            "Check: with one full-attention group both are plain LRU prefix caches; vLLM and "
            f"hybridkv lru {'agree exactly' if same else 'DIFFER'} (hit tokens "
            f"{v.hit_tokens:,} vs {o.hit_tokens:,}, cached blocks {v.cached_blocks} vs "
            f"{o.cached_blocks})."
        )
    lines.append("")
    if cell.has_mamba and "hybrid" in cell.ours:
        lines += [target_line(cell), ""]
    return lines


def target_line(cell: Cell) -> str:
    """The issue's vLLM target on one Mamba cell, met or not, and the ceilings.

    State memory counts as less when it is less at the end and on average
    while the pool is under pressure (``pressure_mean``); the peak is shown.
    """
    best_r, best = cell.best_vllm()
    ratio, ours, theirs = versus_vllm(cell, cell.ours["hybrid"])
    sk = cell.state_kind or "mamba"
    hit_ok = ratio >= TARGET_RATIO
    mem_ok = ours[0] < theirs[0] and ours[1] < theirs[1]
    verdict = "MET" if hit_ok and mem_ok else "NOT MET"
    lru_ceiling, belady = cell.ceiling
    need = TARGET_RATIO * best.token_hit_rate
    return (
        f"**Target ({cell.layout} @ {memory_label(cell.memory_bytes)}): {verdict}.** "
        f"hybrid / vLLM best ({best_r}) hit rate = {ratio:.2f}x (need >= {TARGET_RATIO}x: "
        f"{'yes' if hit_ok else 'no'}); cached {sk} state, end {ours[0]:.2f} GB vs "
        f"{theirs[0]:.2f} GB, mean under pressure {ours[1]:.2f} GB vs {theirs[1]:.2f} GB "
        f"(need less: {'yes' if mem_ok else 'no'}); peak {ours[2]:.2f} GB vs "
        f"{theirs[2]:.2f} GB. Ceilings with every page full attention "
        f"(`benchmarks/ceilings.py`): LRU {100 * lru_ceiling:.2f} %, offline optimal "
        f"{100 * belady:.2f} %; {TARGET_RATIO}x vLLM needs {100 * need:.2f} %"
        + (
            ", above what any cache ranked by recency alone can reach (hybrid ranks "
            "returning requests' units higher, `policy/returning.py`)"
            if need > lru_ceiling
            else ""
        )
        + "."
        + tuned_clause(cell)
    )


def versus_vllm(cell: Cell, o: OursResult) -> tuple[float, list[float], list[float]]:
    """``o``'s hit rate over vLLM's best, and the cached state GB (end, mean
    under pressure, peak) of ``o`` and of vLLM's best."""
    _, best = cell.best_vllm()
    s, sk = o.sim, cell.state_kind or "mamba"
    ratio = s.token_hit_rate / best.token_hit_rate if best.token_hit_rate else float("inf")

    def gb(blocks: dict, page: int) -> float:
        return blocks.get(sk, 0) * page / 1e9

    ours = [
        gb(c, cell.page_bytes)
        for c in (s.cached_blocks, o.pressured_mean_blocks, o.peak_cached_blocks)
    ]
    theirs = [
        gb(c, cell.vllm_page_bytes)
        for c in (best.cached_blocks, best.pressured_mean_blocks, best.peak_cached_blocks)
    ]
    return ratio, ours, theirs


def tuned_clause(cell: Cell) -> str:
    """The target with ``hybrid``'s knobs set by hand (``--value-weights``),
    as vLLM's retention is swept: one sentence per tuned run, "" for none."""
    out = []
    for label, o in cell.ours.items():
        if not label.startswith("hybrid ("):
            continue
        ratio, ours, theirs = versus_vllm(cell, o)
        ok = ratio >= TARGET_RATIO and ours[0] < theirs[0] and ours[1] < theirs[1]
        out.append(
            f" Tuned, {label}: {ratio:.2f}x, state end {ours[0]:.2f} GB, mean under "
            f"pressure {ours[1]:.2f} GB ({'met' if ok else 'not met'} with this knob)."
        )
    return "".join(out)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


HEADER = """# Prefix caching side by side with vLLM 0.33's KVCacheManager

Issue 15, "Side by side with vLLM". Each table replays the same expanded Mooncake
requests through vLLM's real `KVCacheManager` (from its unpacked 0.33.0 source, the
shared baseline's import recipe) and through ours, with the same KV cache config: our
planner's groups and specs, built in vLLM's classes with vLLM's own grouping, and the same
`num_blocks`. One request at a time, prompt in chunks of at most 8,192 tokens, one output
token, then free: `hybridkv simulate LAYOUT --trace ... --requests N --max-num-seqs 1
--output-tokens 1 --arrivals closed --memory M --policy P` for ours (its own replay, run
live). vLLM's manager is driven as its scheduler drives it, including, for Mamba layouts,
its align-mode chunking that ends a prefill chunk at the last cacheable block boundary and
at a detected shared-prefix junction (`benchmarks/vllm_ref/replay.py` lists the vLLM code
paths reproduced). Its `prefix_cache_retention_interval` is swept: `0` is vLLM's default
(only the prompt's last aligned state and junction states), `none` keeps every chunk-end
state, `R` also keeps states on multiples of R tokens.

Token hit rate: prefix hit at first admission over prompt tokens. Cached blocks: blocks in
the prefix cache at the end, by kind (a block id spans all layers of its group, so GB =
blocks x the block id's bytes, the same on both sides). Cached state: the non-full kind
(Mamba states, sliding-window blocks); peak sampled every 10 requests. Under `hybrid`
the peak comes once, when the pool first fills (Jamba: request ~160 of 1,500 at 40 GB,
~340 at 80 GB): until then every kept state stays, in room nothing else wants, and
eviction halves them within the next 20-40 requests.
"""


FIDELITY = """## How faithful the vLLM side is

- **Config.** vLLM's grouping (`kv_cache_planning`: `is_kv_cache_spec_uniform`,
  `unify_kv_cache_spec_page_size`, `_get_kv_cache_groups_uniform_page_size`, executed from
  its source) is run on our per-layer specs; page-size unification leaves them unchanged
  and the groups come out as ours (a note under a table says otherwise). jamba-v0.1's
  80-token block is vLLM's platform rule (16 x ceil(Mamba state 311,296 B / (16 x 4,096 B
  per attention token))), its Mamba page padded to the attention page as vLLM pads it.
  Block hashes at the block size (no `prefix_match_unit`), so no sub-block partial hits.
- **Mamba states.** `mamba_cache_mode="align"` (what prefix caching selects). Jamba's
  Mamba1 mixer exports no internal prefill checkpoints, so, as in vLLM, a state exists
  only where a prefill chunk ends. Chunk ends follow `Scheduler._mamba_block_aligned_split`
  (`benchmarks/vllm_ref/chunking.py`): block-aligned chunks, a stop at the last cacheable
  boundary `(num_tokens - 1) // block * block`, and a stop at the shared-prefix junction
  (`get_computed_blocks`' third result, stored as `request.shared_prefix_boundary`),
  block-floored because `enable_mamba_shared_prefix_checkpoint` is off by default (it also
  needs EAGLE). Every chunk end of every run is checked against vLLM's own method, executed
  from its source on a stand-in scheduler (count under each Mamba table).
- **Retention.** Passed as `KVCacheConfig.prefix_cache_retention_interval`, as vLLM's
  engine resolves it from `CacheConfig` (default 0). Nothing in vLLM's scheduler reads it:
  chunks do not end at its multiples, so in align mode a periodic state exists only where a
  chunk end happens to fall on a multiple of R.
- **Not reproduced.** vLLM 0.33 schedules asynchronously by default (the next chunk is
  scheduled while the previous one runs). With one request at a time this changes no hit
  or caching decision (blocks are cached at allocation); it only returns a request's
  superseded Mamba state blocks one step later. These runs are synchronous.
"""


def render(cells: list[Cell], args: argparse.Namespace, env: str, n_req: int, tokens: int) -> str:
    lines = [
        HEADER,
        f"## {Path(args.trace).name}, first {n_req:,} requests ({tokens:,} prompt tokens)",
        "",
        f"Machine: {machine()}. vLLM {env}. hybridkv {git_commit()}. Generated by "
        f"`benchmarks/bench_vllm_cache.py` on {datetime.date.today().isoformat()}.",
        "",
    ]
    for cell in cells:
        lines += render_cell(cell)
    lines.append(FIDELITY)
    mamba = [c for c in cells if c.has_mamba and "hybrid" in c.ours]
    if mamba:
        lines += ["## The issue's vLLM target", ""]
        lines += [f"- {target_line(c)}" for c in mamba]
        lines.append("")
    return "\n".join(lines)


def to_json(cells: list[Cell]) -> list[dict]:
    out = []
    for c in cells:
        out.append(
            {
                "layout": c.layout,
                "memory_bytes": c.memory_bytes,
                "num_blocks": c.num_blocks,
                "page_bytes": c.page_bytes,
                "vllm_page_bytes": c.vllm_page_bytes,
                "vllm": {
                    r: {
                        "token_hit_rate": v.token_hit_rate,
                        "cached_blocks": v.cached_blocks,
                        "peak_cached_blocks": v.peak_cached_blocks,
                        "seconds": v.seconds,
                        "junction_chunks": v.junction_chunks,
                    }
                    for r, v in c.vllm.items()
                },
                "hybridkv": {
                    p: {
                        "token_hit_rate": o.sim.token_hit_rate,
                        "cached_blocks": o.sim.cached_blocks,
                        "peak_cached_blocks": o.peak_cached_blocks,
                        "seconds": o.sim.replay_seconds,
                    }
                    for p, o in c.ours.items()
                },
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", default=str(DEFAULT_TRACE))
    p.add_argument("--requests", type=int, default=1500, help="first N requests (default 1500)")
    p.add_argument("--output-tokens", type=int, default=1)
    p.add_argument("--layouts", default=DEFAULT_LAYOUTS, help="comma list (names or YAML)")
    p.add_argument("--memory", default="40GB,80GB", help="comma list of KV budgets")
    p.add_argument("--policies", default="lru,hybrid", help="comma list of our policies")
    p.add_argument(
        "--retention",
        default=DEFAULT_RETENTION,
        help=f"vLLM retention intervals to try (default {DEFAULT_RETENTION})",
    )
    p.add_argument(
        "--value-weights",
        default="",
        help="comma list: also run hybrid with each hybrid_value_weight (tuned rows)",
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the model length to plan for (default: the layout's; the synthetic trace has "
        "prompts beyond Granite 4.0 H Tiny's 131,072)",
    )
    p.add_argument("--sample-every", type=int, default=10)
    p.add_argument(
        "--no-check-chunk-rule",
        dest="check_chunk_rule",
        action="store_false",
        help="skip checking each chunk end against vLLM's own split function",
    )
    p.add_argument("--vllm-src", type=Path, default=default_vllm_src())
    p.add_argument("--harness", type=Path, default=default_harness())
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--json", help="write the figures as JSON here")
    p.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = p.parse_args()
    args.policies = args.policies.split(",")
    args.value_weights = [float(w) for w in args.value_weights.split(",") if w]
    args.retention = retention_values(args.retention)

    vl = load_vllm(args.vllm_src, args.harness)
    env = f"{vl.version} (source {vl.src.name})"
    requests = load_trace(args.trace, limit=args.requests, output_tokens=args.output_tokens)
    tokens = sum(r.input_length for r in requests)
    print(f"machine: {machine()}; vLLM {env}; {len(requests):,} requests, {tokens:,} tokens")
    cells = []
    for name in args.layouts.split(","):
        layout = resolve_layout(name)
        for memory in args.memory.split(","):
            print(f"{layout.name} @ {memory}", flush=True)
            cells.append(run_cell(vl, layout, requests, parse_memory(memory), args))
    text = render(cells, args, env, len(requests), tokens)
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(cells), indent=1))
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")
        print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
