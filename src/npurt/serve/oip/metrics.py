"""Prometheus metrics of ``npurt serve`` (``/metrics``, Prometheus' text format, with ``prometheus_client``).

Names (documented in docs/serve.md):

- ``npurt_requests_total{model,protocol}``: Open Inference Protocol infer requests (protocol "http" / "grpc");
  ``npurt_request_failures_total{model,protocol}``: those answered with an error (any status but 200 / OK).
- ``npurt_jobs_total{model}`` / ``npurt_job_failures_total{model}``: runs of the served model, from every protocol
  (the local socket's included).
- ``npurt_queue_seconds{model}``: how long a job waited for a free slot of its model (histogram);
  ``npurt_compute_seconds{model}``: how long it ran (histogram).
- ``npurt_runner_copies_total{model}`` / ``npurt_runner_bytes_copied_total{model}``: the served runner's host copies
  (``runner.stats``: view conversions, staging), read at each scrape.
- ``npurt_serve_copies_total{model}`` / ``npurt_serve_bytes_copied_total{model}``: the copies the server made of
  request data (a shared memory input not aligned for its type, an output copied into its region).
- ``npurt_shm_regions``: registered system shared memory regions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# 50 us to 10 s: the classifier's runs are ~0.5 ms, a 1080p detector's seconds
BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _RunnerCopies(Collector):
    """The runners' own copy counters, read when Prometheus scrapes (no bookkeeping on the run path)."""

    def __init__(self, stats_of: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self.stats_of = stats_of

    def collect(self) -> Iterable[Any]:
        copies = CounterMetricFamily("npurt_runner_copies", "host copies the served runner made", labels=["model"])
        nbytes = CounterMetricFamily("npurt_runner_bytes_copied", "bytes the served runner copied", labels=["model"])
        for model, stats in self.stats_of().items():
            copies.add_metric([model], float(stats.get("copies", 0)))
            nbytes.add_metric([model], float(stats.get("bytes_copied", 0)))
        yield copies
        yield nbytes


class ServeMetrics:
    """The server's metrics in a registry of its own (not the process-global one)."""

    def __init__(self, runner_stats: Callable[[], Mapping[str, Mapping[str, int]]],
                 regions: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("npurt_requests", "Open Inference Protocol infer requests", ["model", "protocol"],
                                registry=r)
        self.request_failures = Counter("npurt_request_failures", "infer requests answered with an error",
                                        ["model", "protocol"], registry=r)
        self.jobs = Counter("npurt_jobs", "runs of a served model (every protocol)", ["model"], registry=r)
        self.job_failures = Counter("npurt_job_failures", "runs of a served model that failed", ["model"], registry=r)
        self.queue = Histogram("npurt_queue_seconds", "time a job waited for a slot of its model", ["model"],
                               buckets=BUCKETS, registry=r)
        self.compute = Histogram("npurt_compute_seconds", "time a job ran", ["model"], buckets=BUCKETS, registry=r)
        self.serve_copies = Counter("npurt_serve_copies", "copies of request data the server made", ["model"],
                                    registry=r)
        self.serve_bytes = Counter("npurt_serve_bytes_copied", "bytes of request data the server copied", ["model"],
                                   registry=r)
        regions_gauge = Gauge("npurt_shm_regions", "registered system shared memory regions", registry=r)
        regions_gauge.set_function(lambda: float(regions()))
        r.register(_RunnerCopies(runner_stats))

    def job_ran(self, model: str, queued_s: float, compute_s: float, ok: bool) -> None:
        """A served model's job ended (``npurt.serve.served.JobObserver``)."""
        self.jobs.labels(model).inc()
        if not ok:
            self.job_failures.labels(model).inc()
        self.queue.labels(model).observe(queued_s)
        self.compute.labels(model).observe(compute_s)

    def request(self, model: str, protocol: str, ok: bool) -> None:
        self.requests.labels(model, protocol).inc()
        if not ok:
            self.request_failures.labels(model, protocol).inc()

    def copied(self, model: str, nbytes: int) -> None:
        self.serve_copies.labels(model).inc()
        self.serve_bytes.labels(model).inc(nbytes)

    def text(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "ServeMetrics"]
