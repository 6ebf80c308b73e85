"""What ``/metrics`` exposes, in Prometheus text format, named after vLLM's metrics (prefix ``fastmode:``).

Gauges are set from ``Engine.stats()`` after every step; counters and histograms are fed by the engine
thread as outputs come out, so every figure describes the one engine that serves all connections.
Prometheus's standard ``process_*`` figures (CPU seconds, memory) describe the server process as a whole;
``bench serving`` reads its CPU seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from ..engine.engine import EngineStats
from ..engine.outputs import RequestOutput

# Seconds. CPU steps take tens of milliseconds, GPU steps a few: the buckets cover both.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class ServerMetrics:
    """One private registry per server, so two servers in one process never collide."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"fastmode:{name}", doc, labels, registry=r).labels(**labels)

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests queued for admission.")
        self.kv_blocks_used = gauge("kv_blocks_used", "KV cache blocks held by live requests.")
        self.kv_blocks_total = gauge("kv_blocks_total", "KV cache blocks in the pool.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).")
        self.generation_tokens = Counter(
            "fastmode:generation_tokens", "Output tokens generated.", labels, registry=r
        ).labels(**labels)
        self.prompt_tokens = Counter(
            "fastmode:prompt_tokens", "Prompt tokens of finished requests.", labels, registry=r
        ).labels(**labels)
        self.request_success = Counter(
            "fastmode:request_success",
            "Finished requests by finish reason.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "fastmode:time_to_first_token_seconds",
            "Time to first token.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.tpot = Histogram(
            "fastmode:time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.latency = Histogram(
            "fastmode:e2e_request_latency_seconds",
            "End-to-end request latency.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self._model_name = model_name

    def record_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_blocks_used.set(stats.kv_blocks_used)
        self.kv_blocks_total.set(stats.kv_blocks_total)
        self.kv_usage.set(stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0)

    def record_step(self, outputs: list[RequestOutput]) -> None:
        self.generation_tokens.inc(sum(len(c.delta_token_ids) for o in outputs for c in o.outputs))

    def record_finished(self, output: RequestOutput) -> None:
        m = output.metrics
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        for completion in output.outputs:
            self.request_success.labels(
                model_name=self._model_name, finished_reason=completion.finish_reason
            ).inc()
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        if m.tpot is not None:
            self.tpot.observe(m.tpot)
        if m.latency is not None:
            self.latency.observe(m.latency)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
