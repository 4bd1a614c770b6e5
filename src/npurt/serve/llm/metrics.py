"""The language models' Prometheus metrics, in the server's registry (``/metrics``; names in docs/serve.md):

- ``npurt_generation_requests_total{model,api}`` / ``npurt_generation_failures_total{model,api}``: requests (api
  "completions", "chat", "generate") and those answered with an error (refused, failed, or cut short);
- ``npurt_prompt_tokens_total{model}``, ``npurt_generated_tokens_total{model}``; ``npurt_cached_prompt_tokens_total``:
  prompt ids a cache held already (prefix reuse: not prefilled again);
- ``npurt_time_to_first_token_seconds{model}``: from a request's arrival (its queueing included) to its first id;
  ``npurt_inter_token_seconds{model}``: between a sequence's ids (histograms);
- ``npurt_decode_step_rows{model}``: the sequences each engine run of decode steps stepped (a histogram: ``_count``
  the runs, ``_sum`` the sequences' steps; more than one where steps are batched across sequences);
- ``npurt_sequences_cancelled_total{model}``: sequences freed before their end because their client went away;
- ``npurt_sequences_active{model}`` / ``npurt_sequences_queued{model}``: read at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

TTFT_BUCKETS = (1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROWS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
ITL_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)


class _Sequences(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        self.counts = counts

    def collect(self) -> Iterable[Any]:
        active = GaugeMetricFamily("npurt_sequences_active", "sequences generating (each holds a cache)",
                                   labels=["model"])
        queued = GaugeMetricFamily("npurt_sequences_queued", "sequences waiting for a cache", labels=["model"])
        for model, (a, q) in self.counts().items():
            active.add_metric([model], float(a))
            queued.add_metric([model], float(q))
        yield active
        yield queued


class GenerationMetrics:
    """``SequenceObserver`` of the schedulers, and the requests' counters."""

    def __init__(self, registry: CollectorRegistry, counts: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        r = registry
        self.requests = Counter("npurt_generation_requests", "generation requests", ["model", "api"], registry=r)
        self.failures = Counter("npurt_generation_failures", "generation requests answered with an error",
                                ["model", "api"], registry=r)
        self.prompt_tokens = Counter("npurt_prompt_tokens", "prompt ids of the sequences run", ["model"], registry=r)
        self.cached = Counter("npurt_cached_prompt_tokens", "prompt ids a cache held already (not prefilled)",
                              ["model"], registry=r)
        self.generated = Counter("npurt_generated_tokens", "ids generated", ["model"], registry=r)
        self.cancelled = Counter("npurt_sequences_cancelled", "sequences freed early: their client went away",
                                 ["model"], registry=r)
        self.ttft = Histogram("npurt_time_to_first_token_seconds", "a request's arrival to its first id", ["model"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("npurt_inter_token_seconds", "time between a sequence's ids", ["model"],
                             buckets=ITL_BUCKETS, registry=r)
        self.step_rows = Histogram("npurt_decode_step_rows", "sequences stepped by one engine run of decode steps",
                                   ["model"], buckets=ROWS_BUCKETS, registry=r)
        r.register(_Sequences(counts))
        # per model: its TTFT, inter-token and step-rows series (looked up once)
        self._timers: dict[str, tuple[Any, Any, Any]] = {}

    def add_model(self, model: str) -> None:
        """Show a model's series from the start (at 0), not from its first request."""
        for family in (self.prompt_tokens, self.cached, self.generated, self.cancelled):
            family.labels(model)
        self._timers[model] = (self.ttft.labels(model), self.itl.labels(model), self.step_rows.labels(model))

    def first_token(self, model: str, seconds: float) -> None:
        self._timers[model][0].observe(seconds)

    def next_token(self, model: str, seconds: float) -> None:  # once per id: no label lookup
        self._timers[model][1].observe(seconds)

    def decode_step(self, model: str, rows: int) -> None:  # once per run of steps
        self._timers[model][2].observe(rows)

    def sequence_ended(self, model: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                       ok: bool) -> None:
        self.prompt_tokens.labels(model).inc(prompt_tokens)
        self.cached.labels(model).inc(cached_tokens)
        self.generated.labels(model).inc(completion_tokens)
        if not ok:
            self.cancelled.labels(model).inc()

    def request(self, model: str, api: str, ok: bool) -> None:
        self.requests.labels(model, api).inc()
        if not ok:
            self.failures.labels(model, api).inc()


__all__ = ["GenerationMetrics"]
