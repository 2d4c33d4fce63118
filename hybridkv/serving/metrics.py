"""``ServerMetrics``: what ``GET /metrics`` exposes, in Prometheus' text format.

Names follow vLLM's (``vllm:*``) with the prefix ``hybridkv:``; every series
has a ``model_name`` label. Counters (exposed with ``_total``):
``prefix_cache_queries`` / ``prefix_cache_hits`` (tokens of first lookups),
``num_preemptions``, ``prompt_tokens``, ``generation_tokens``,
``request_success`` (by ``finished_reason``: stop, length, abort, error).
Histograms: ``time_to_first_token_seconds``, ``inter_token_latency_seconds``,
``e2e_request_latency_seconds``. Gauges, refreshed in the engine thread at
each scrape (``refresh``): ``num_requests_running``, ``num_requests_waiting``,
``kv_cache_usage_perc`` (0-1, all groups), ``kv_cache_group_usage_perc`` (by
``group`` and ``kind``: the pages of that group's tables over the pool),
``prefix_cache_blocks`` (blocks in the prefix index) and ``orphan_blocks``:
blocks still held by a request the engine no longer runs (finished or
aborted). It must read 0: anything else is a leak. With KV tiers
(``--kv-offloading-size``), their series too (``tier_metrics.py``).

Every series is exported from the start, at 0 (``kv_cache_group_usage_perc``
from the first scrape). Counters and histograms are written by the engine thread; prometheus-client
makes that safe for the scraping thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridkv.core.stats import PrefixCacheStats
from hybridkv.serving.store_metrics import StoreMetrics
from hybridkv.serving.tier_metrics import TierMetrics

if TYPE_CHECKING:
    from hybridkv.engine.engine_request import EngineRequest
    from hybridkv.engine.llm import LLM

P = "hybridkv:"
#: ``request_success``'s ``finished_reason`` values.
FINISHED_REASONS = ("stop", "length", "abort", "error")
_TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
)


class ServerMetrics:
    """One registry per server (module docstring)."""

    def __init__(self, model_name: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]
        self._name = model_name

        def counter(name: str, doc: str, labels: list[str] = m) -> Any:
            return Counter(P + name, doc, labels, registry=r)

        def gauge(name: str, doc: str, labels: list[str] = m) -> Any:
            return Gauge(P + name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(P + name, doc, m, buckets=buckets, registry=r)

        self.queries = counter("prefix_cache_queries", "Prefix-cache queries, in tokens.")
        self.hits = counter("prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self.preempted = counter("num_preemptions", "Requests preempted.")
        self.prompt = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generated = counter("generation_tokens", "Tokens generated.")
        self.success = counter(
            "request_success", "Requests ended, by reason.", [*m, "finished_reason"]
        )
        self.ttft = histogram(
            "time_to_first_token_seconds", "Arrival to first token.", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Between two output tokens.", _ITL_BUCKETS
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _E2E_BUCKETS)
        self.running = gauge("num_requests_running", "Requests running.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting.")
        self.usage = gauge("kv_cache_usage_perc", "KV pages in use, 0-1.")
        self.group_usage = gauge(
            "kv_cache_group_usage_perc",
            "KV pages in use by one group's tables, 0-1.",
            [*m, "group", "kind"],
        )
        self.cached = gauge("prefix_cache_blocks", "Blocks in the prefix-cache index.")
        self.orphans = gauge(
            "orphan_blocks", "Blocks held by finished or aborted requests (must be 0)."
        )
        # Every series exists from the start, at 0: a dashboard shows 0, not "no data".
        for metric in (self.queries, self.hits, self.preempted, self.prompt, self.generated):
            metric.labels(model_name)
        for metric in (self.ttft, self.itl, self.e2e, self.running, self.waiting, self.usage):
            metric.labels(model_name)
        for metric in (self.cached, self.orphans):
            metric.labels(model_name)
        for reason in FINISHED_REASONS:
            self.success.labels(model_name, reason)
        self.tiers: TierMetrics | None = None  # made at the first refresh with tiers
        self.store: StoreMetrics | None = None  # likewise, with a store tier

    # -- written by the engine thread ------------------------------------------------
    def prefix_cache(self, stats: PrefixCacheStats | None) -> None:
        if stats is not None and stats.queries:
            self.queries.labels(self._name).inc(stats.queries)
            self.hits.labels(self._name).inc(stats.hits)

    def preemptions(self, n: int) -> None:
        if n:
            self.preempted.labels(self._name).inc(n)

    def tokens(self, stream: Any, req: EngineRequest, n: int, now: float) -> None:
        """``n`` new tokens of ``req`` handed to ``stream`` at ``now``."""
        if not n:
            return
        self.generated.labels(self._name).inc(n)
        if stream.last_token_time is None:
            self.ttft.labels(self._name).observe(now - req.metrics.arrival_time)
        else:
            self.itl.labels(self._name).observe((now - stream.last_token_time) / n)
        stream.last_token_time = now

    def request_finished(self, reason: str, req: EngineRequest | None = None) -> None:
        self.success.labels(self._name, reason).inc()
        if req is not None:
            self.prompt.labels(self._name).inc(len(req.core.prompt_token_ids))
            end = req.metrics.finished_time
            if end is not None:
                self.e2e.labels(self._name).observe(end - req.metrics.arrival_time)

    def refresh(self, llm: LLM) -> None:
        """Set the gauges from the engine's state (run in the engine thread)."""
        name = self._name
        scheduler, manager = llm.scheduler, llm.manager
        self.running.labels(name).set(len(scheduler.running))
        self.waiting.labels(name).set(len(scheduler.waiting))
        self.usage.labels(name).set(manager.usage)
        pool = manager.block_pool
        usable = pool.num_blocks - 1
        held, orphans = table_blocks(llm)
        for gid, m in enumerate(manager.coordinator.managers):
            self.group_usage.labels(name, str(gid), m.spec.kind).set(len(held[gid]) / usable)
        self.cached.labels(name).set(pool.num_cached_blocks())
        self.orphans.labels(name).set(len(orphans))
        if llm.tiers is not None:
            if self.tiers is None:
                self.tiers = TierMetrics(self.registry, name)
            self.tiers.refresh(llm.tiers)
            if llm.tiers.store is not None:
                if self.store is None:
                    self.store = StoreMetrics(self.registry, name)
                self.store.refresh(llm.tiers)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def table_blocks(llm: LLM) -> tuple[list[set[int]], set[int]]:
    """Block ids in the tables of each group, and those held by requests the
    scheduler no longer runs (orphans: finished or aborted, never freed)."""
    running = {r.request_id for r in llm.scheduler.running}
    held: list[set[int]] = []
    orphans: set[int] = set()
    for m in llm.manager.coordinator.managers:
        group: set[int] = set()
        for rid, st in m.states.items():
            ids = {b.block_id for b in st.blocks if not b.is_null}
            ids.update(b.block_id for _, b in st.retained)
            group |= ids
            if rid not in running:
                orphans |= ids
        held.append(group)
    return held, orphans
