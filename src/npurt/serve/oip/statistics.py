"""Triton's statistics extension (``GET /v2/models[/{m}[/versions/{v}]]/stats``, gRPC ``ModelStatistics``): per
served model, counts and nanoseconds of its infer requests, in Triton's schema.

What each duration is in npurt's pipeline (one request, admitted):

- ``success`` / ``fail``: the whole request, from the start of input decoding to its answer encoded (or its error);
- ``compute_input``: the request's inputs decoded (JSON, binary, protobuf) and staged for the engine (arrays over the
  request's bytes or shared memory, tensors bound), until its job is queued;
- ``queue``: from the job's admission to the served model's queue until it starts (0 where a slot was free);
- ``compute_infer``: the engine's run;
- ``compute_output``: the outputs encoded into the response.

The last four are counted for successful requests only, as Triton does. ``inference_count`` and ``execution_count``
are equal (npurt does not batch requests together: ``max_batch_size`` 0); a run that failed counts as an execution.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@dataclass
class Timeline:
    """One request's moments (``time.monotonic()`` seconds; 0: not reached)."""

    received: float = 0.0  # decoding starts
    queued: float = 0.0  # the job is made and handed to the served model
    started: float = 0.0  # the engine's run starts
    ran: float = 0.0  # ... and ends
    encoding: float = 0.0  # the answer's encoding starts


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


@dataclass
class ModelStatistics:
    """One served model's figures, updated by every request (thread-safe)."""

    name: str
    version: str
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    durations: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in PHASES})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, t: Timeline, ok: bool) -> None:
        """One request answered (``ok``) or failed, at its end."""
        end = time.monotonic()
        with self._lock:
            if t.started:
                self.execution_count += 1
                self.last_inference_ms = int(time.time() * 1000)
            if not ok:
                self._add("fail", end - t.received)
                return
            self.inference_count += 1
            self._add("success", end - t.received)
            self._add("compute_input", t.queued - t.received)
            self._add("queue", t.started - t.queued)
            self._add("compute_infer", t.ran - t.started)
            self._add("compute_output", end - t.encoding)

    def _add(self, phase: str, seconds: float) -> None:
        entry = self.durations[phase]
        entry[0] += 1
        entry[1] += _ns(seconds)

    def doc(self) -> dict[str, Any]:
        """The model's entry of ``model_stats`` as Triton's HTTP API writes it."""
        with self._lock:
            return {"name": self.name, "version": self.version, "last_inference": self.last_inference_ms,
                    "inference_count": self.inference_count, "execution_count": self.execution_count,
                    "inference_stats": {k: {"count": c, "ns": ns} for k, (c, ns) in self.durations.items()},
                    "response_stats": {}, "batch_stats": [], "memory_usage": []}


__all__ = ["PHASES", "ModelStatistics", "Timeline"]
