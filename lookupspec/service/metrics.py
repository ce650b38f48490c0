"""Prometheus metrics of one gateway process (``GET /metrics``).

Speculation counters use vLLM's names under the ``lookupspec_`` prefix and the vocabulary of
``lookupspec.verify``: a *draft* is one step's proposed tokens (``num_drafts`` counts steps that
verified at least one draft token), ``num_accepted_tokens_per_pos{position=i}`` counts steps whose
accepted run reached draft position i (0-based). Latencies: time to first token (request arrival to
the first emitted token, queueing included) and inter-token latency (observed once per emitted token;
a step that emits k tokens contributes k observations of its gap / k). Gauges that describe state
(queue depth, store sizes and health) are read when scraped, from a snapshot callback.

Every ``ServiceMetrics`` has its own registry, so several apps can live in one process (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lookupspec.stats import RequestStats

__all__ = ["CONTENT_TYPE", "ServiceMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                    0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
_P = "lookupspec_"


class _Snapshot(Collector):
    """Gauges and counters read at scrape time from ``snapshot()`` (see ``Service.snapshot``)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield _gauge("queue_depth", "requests waiting for a slot", s["queue_depth"])
        yield _gauge("num_requests_waiting", "requests waiting for a slot (as queue_depth)",
                     s["queue_depth"])
        yield _gauge("num_requests_running", "sequences holding a slot (prefilling or decoding)",
                     s["running"])
        sched = s.get("scheduler")
        if sched is not None:
            yield from _scheduler_metrics(sched)
        pc = s.get("prefix_cache")
        if pc is not None:
            yield _counter("prefix_cache_lookups", "prompts looked up in the prefix cache", pc.lookups)
            yield _counter("prefix_cache_hits", "prompts that reused cached chunks", pc.hits)
            yield _counter("prefix_cache_hit_tokens", "prompt tokens reused from the prefix cache",
                           pc.hit_tokens)
            yield _counter("prefix_cache_evictions", "chunks evicted from the prefix cache", pc.evicted)
            yield _gauge("prefix_cache_blocks", "chunks held by the prefix cache", pc.blocks)
            yield _gauge("prefix_cache_bytes", "bytes held by the prefix cache", pc.bytes)
        kv = s["kv_cache"]
        yield _gauge("kv_cache_bytes", "bytes allocated for the KV cache (all slots, used or free)",
                     kv["bytes"])
        yield _counter("kv_cache_resizes", "times the KV cache grew (each copies it while every stream "
                       "waits; --kv-cache-mb reserves it at start instead)", kv["resizes"])
        yield _counter("kv_cache_resize_seconds", "time those growths took", kv["resize_s"])
        yield _gauge("engine_healthy", "1 while the generation worker is alive and working", s["engine_ok"])
        yield _gauge("draining", "1 after SIGTERM: new requests are refused", s["draining"])
        store = s["store"]
        backend = str(store.get("backend", "unknown"))
        up = GaugeMetricFamily(_P + "store_healthy", "1 when the shared store is ok, 0 when degraded "
                               "(Redis unreachable or writes failing)", labels=["backend"])
        up.add_metric([backend], 1.0 if store.get("state") == "ok" else 0.0)
        yield up
        yield _gauge("store_buffered_records", "appends held in memory until Redis returns",
                     store.get("buffered", 0))
        yield _gauge("store_lag_seconds", "how long this replica may have missed other replicas' writes",
                     store.get("lag_s", 0.0))
        yield _counter("store_buffer_overflow", "appends rejected because the buffer was full",
                       store.get("overflow", 0))
        yield _counter("store_outages", "times the store went from ok to degraded", store.get("outages", 0))
        yield _counter("store_corrupt_records", "damaged log records or regions skipped",
                       store.get("corrupt_records", store.get("corrupt_regions", 0)))
        for key, help_text in (("namespaces", "namespaces with data"),
                               ("collections", "live document collections"),
                               ("documents", "live documents"),
                               ("document_tokens", "tokens of live documents"),
                               ("outputs", "outputs in the shared output logs"),
                               ("output_tokens", "tokens in the shared output logs")):
            yield _gauge(f"store_{key}", help_text, store.get(key, 0))
        idx = s["indexes"]
        mem = GaugeMetricFamily(_P + "index_memory_bytes", "bytes held by this replica's lookup indexes",
                                labels=["kind"])
        mem.add_metric(["corpus"], float(idx["corpus_bytes"]))
        mem.add_metric(["output"], float(idx["output_bytes"]))
        yield mem
        tok = GaugeMetricFamily(_P + "index_tokens", "tokens indexed for lookup", labels=["kind"])
        tok.add_metric(["corpus"], float(idx["corpus_tokens"]))
        tok.add_metric(["output"], float(idx["output_tokens"]))
        yield tok


def _scheduler_metrics(st: Any) -> Iterator[Metric]:
    """The scheduler's counters (``lookupspec.scheduler.SchedulerStats``): what its steps and prefills
    did, and draft nodes per sequence against the batch size."""
    yield _counter("scheduler_steps", "decode/verify steps (one forward over every running sequence)",
                   st.steps)
    yield _counter("scheduler_step_rows", "rows of all steps (root + draft nodes of every sequence)",
                   st.step_rows)
    yield _counter("scheduler_step_sequences", "sequences of all steps", st.step_seqs)
    yield _counter("decode_seconds", "time spent in decode/verify steps (of a forward shared with prompt "
                   "chunks: the step's estimated cost alone)", st.decode_s)
    yield _counter("decode_tokens", "tokens emitted by decode/verify steps", st.decode_tokens)
    yield _counter("prefill_seconds", "time spent prefilling prompt chunks", st.prefill_s)
    yield _counter("prefill_tokens", "prompt tokens prefilled", st.prefill_tokens)
    yield _counter("scheduler_shared_forwards", "forwards that ran prompt chunks and a decode step together",
                   st.shared_forwards)
    yield _gauge("scheduler_prefill_budget_tokens", "prompt tokens the last forward with prompt chunks "
                 "could carry (--prefill-chunk, or less while sequences decode: --prefill-stretch)",
                 st.prefill_budget)
    yield _gauge("decode_tokens_per_second", "decode throughput: decode_tokens / decode_seconds",
                 st.decode_tokens / st.decode_s if st.decode_s > 0 else 0.0)
    steps = CounterMetricFamily(_P + "batch_steps", "steps, by batch size", labels=["batch_size"])
    seqs = CounterMetricFamily(_P + "batch_sequences", "sequences in those steps, by batch size",
                               labels=["batch_size"])
    nodes = CounterMetricFamily(_P + "batch_draft_nodes", "draft nodes verified in those steps, by batch "
                                "size (divide by batch_sequences: nodes per sequence)", labels=["batch_size"])
    for size, (n_steps, n_seqs, n_nodes) in sorted(dict(st.by_batch).items()):
        steps.add_metric([str(size)], float(n_steps))
        seqs.add_metric([str(size)], float(n_seqs))
        nodes.add_metric([str(size)], float(n_nodes))
    yield steps
    yield seqs
    yield nodes


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(_P + name, help_text, value=float(value))


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(_P + name, help_text, value=float(value))


class ServiceMetrics:
    """The process's metrics. Counters and histograms are updated by the service (thread-safe)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]] | None = None) -> None:
        r = self.registry = CollectorRegistry()
        sd = _P + "spec_decode_"
        self.num_drafts = Counter(sd + "num_drafts", "steps that verified at least one draft token",
                                  registry=r)
        self.num_draft_tokens = Counter(sd + "num_draft_tokens", "draft tokens proposed", registry=r)
        self.num_accepted_tokens = Counter(sd + "num_accepted_tokens", "draft tokens accepted", registry=r)
        self.num_steps = Counter(sd + "num_steps", "target forwards after the prefill", registry=r)
        self.accepted_per_pos = Counter(sd + "num_accepted_tokens_per_pos",
                                        "steps whose accepted run reached draft position `position`",
                                        ["position"], registry=r)
        self.draft_tokens_by_source = Counter(sd + "num_draft_tokens_by_source",
                                              "draft tokens proposed, by drafter", ["source"], registry=r)
        self.accepted_tokens_by_source = Counter(sd + "num_accepted_tokens_by_source",
                                                 "draft tokens accepted, by drafter", ["source"], registry=r)
        self.ttft = Histogram(_P + "time_to_first_token_seconds", "request arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(_P + "inter_token_latency_seconds", "time between emitted tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(_P + "e2e_request_latency_seconds", "request arrival to its last token",
                             buckets=_REQUEST_BUCKETS, registry=r)
        self.queue_time = Histogram(_P + "request_queue_time_seconds", "time waiting for the worker",
                                    buckets=_REQUEST_BUCKETS, registry=r)
        self.prompt_tokens = Counter(_P + "prompt_tokens", "prompt tokens of finished choices", registry=r)
        self.generation_tokens = Counter(_P + "generation_tokens", "tokens generated", registry=r)
        self.requests = Counter(_P + "http_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.rejected = Counter(_P + "requests_rejected", "generation requests refused before queueing",
                                ["reason"], registry=r)
        self.aborted = Counter(_P + "requests_aborted", "generations stopped early",
                               ["reason"], registry=r)
        self.output_appends = Counter(_P + "output_appends", "outputs appended to the shared output log",
                                      ["result"], registry=r)
        if snapshot is not None:
            r.register(_Snapshot(snapshot))

    def observe_stats(self, stats: RequestStats, prompt_tokens: int, completion_tokens: int) -> None:
        """One finished choice's speculation statistics."""
        self.num_steps.inc(stats.steps)
        self.num_drafts.inc(stats.draft_steps)
        self.num_draft_tokens.inc(stats.draft_tokens)
        self.num_accepted_tokens.inc(stats.accepted_tokens)
        for pos, n in enumerate(stats.accepted_per_position):
            if n:
                self.accepted_per_pos.labels(position=str(pos)).inc(n)
        for source, n in stats.draft_tokens_by_source.items():
            self.draft_tokens_by_source.labels(source=source).inc(n)
        for source, n in stats.accepted_tokens_by_source.items():
            self.accepted_tokens_by_source.labels(source=source).inc(n)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
