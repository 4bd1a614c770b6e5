"""The timing loops: every measurement npurt makes of itself goes through these.

On a shared machine a subject's speed drifts from second to second, so nothing here times one subject after the
other: subjects take turns in blocks, and comparisons are made between neighbouring blocks.

- ``measure_latency``: each subject's ``step()`` timed one call at a time, in ``budget.blocks`` blocks whose order
  rotates (A B C, B C A, ...). The first ``budget.settle`` calls of each block are not timed: after a run an
  engine's threads may spin-wait for more work (ONNX Runtime's do), and another engine's call right after competes
  with them for the cores. ``paired_difference_ms`` compares two subjects call for call.
- ``measure_throughput``: each subject's ``run_jobs(budget)`` (its requests kept in flight) in alternating blocks;
  ``paired_ratio`` is the median of per-block ratios, robust to load that drifts between pairs of blocks (the ratio
  of two totals is not).
- ``keep_in_flight``: npurt's asynchronous loop: ``execute_async`` keeping one job per tensor set in flight.
- ``stopwatch``: one timed call (loads, first inferences).
"""

from __future__ import annotations

import statistics
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO, TypeVar

from ..types import NpuError, StatusCode
from .results import LatencyStats, ThroughputStats

T = TypeVar("T")


class BenchError(NpuError):
    """A measurement could not run (an inference or a job failed)."""


@dataclass(frozen=True)
class Budget:
    """How long each measurement runs per subject: ``niter`` iterations or ``time_s`` seconds, whichever ends
    first, split into ``blocks``; ``warmup`` untimed calls per subject first, ``settle`` at the start of each block."""

    niter: int | None = None
    time_s: float | None = 3.0
    warmup: int = 5
    blocks: int = 10
    settle: int = 1

    def __post_init__(self) -> None:
        if self.niter is None and self.time_s is None:
            raise ValueError("a budget needs niter or time_s")
        if self.niter is not None and self.niter < 1:
            raise ValueError(f"niter must be >= 1, got {self.niter}")
        if self.time_s is not None and not self.time_s > 0:
            raise ValueError(f"time must be > 0 seconds, got {self.time_s}")
        if self.blocks < 1 or self.warmup < 0 or self.settle < 0:
            raise ValueError(f"blocks >= 1, warmup >= 0 and settle >= 0, got {self.blocks}, {self.warmup}, "
                             f"{self.settle}")

    def per_block(self) -> Budget:
        return replace(self, niter=None if self.niter is None else -(-self.niter // self.blocks),
                       time_s=None if self.time_s is None else self.time_s / self.blocks, warmup=0, blocks=1)

    def fraction(self, count: int, elapsed: float) -> float:
        parts = []
        if self.niter is not None:
            parts.append(count / self.niter)
        if self.time_s is not None:
            parts.append(elapsed / self.time_s)
        return min(1.0, max(parts))

    def done(self, count: int, elapsed: float) -> bool:
        return self.fraction(count, elapsed) >= 1.0


class Progress:
    """A plain-text progress bar on a stream (stderr): redrawn in place on a terminal, one line per phase else."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True, width: int = 30,
                 prefix: str = "npurt bench") -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.width = width
        self.prefix = prefix
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._label = ""
        self._last = 0.0

    def phase(self, label: str) -> None:
        if not self.enabled:
            return
        self._label = label
        self._last = 0.0
        if self.tty:
            self.update(0.0, force=True)
        else:
            print(f"{self.prefix}: {label} ...", file=self.stream, flush=True)

    def update(self, fraction: float, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        filled = int(round(self.width * min(max(fraction, 0.0), 1.0)))
        bar = "#" * filled + "-" * (self.width - filled)
        print(f"\r{self._label[:44]:<44} [{bar}] {fraction * 100:3.0f}%", end="", file=self.stream, flush=True)

    def done(self) -> None:
        if self.tty and self._label:
            self.update(1.0, force=True)
            print(file=self.stream, flush=True)
        self._label = ""


NO_PROGRESS = Progress(enabled=False)


class Subject(ABC):
    """Something to measure: one synchronous inference (``step``) and, for throughput, ``run_jobs``."""

    label: str = ""
    requests: int = 1

    @abstractmethod
    def step(self) -> None:
        """One inference (or whatever one call is), on the calling thread."""

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        """Keep ``requests`` inferences in flight until the budget is spent: (inferences done, seconds)."""
        raise NotImplementedError(f"{self.label or type(self).__name__} measures no throughput")

    def close(self) -> None:  # noqa: B027 - most subjects hold nothing
        """Release what the subject holds (thread pools)."""


class CallSubject(Subject):
    """Any callable as a latency subject."""

    def __init__(self, label: str, fn: Callable[[], Any]) -> None:
        self.label, self.fn = label, fn

    def step(self) -> None:
        self.fn()


def stopwatch(fn: Callable[[], T]) -> tuple[T, float]:
    """Call ``fn`` once: (its result, milliseconds)."""
    t0 = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - t0) * 1e3


def _rotations(n: int, blocks: int) -> list[list[int]]:
    """Block k runs the subjects starting from subject k mod n, so that none always follows another."""
    return [[(k + m) % n for m in range(n)] for k in range(blocks)]


def measure_latency(subjects: Sequence[Subject], budget: Budget, progress: Progress = NO_PROGRESS,
                    label: str = "latency") -> list[LatencyStats]:
    """Latency of each subject's ``step``: warm-up, then the budget per subject in rotating blocks."""
    progress.phase(f"{label}: warm-up")
    for subject in subjects:
        for _ in range(budget.warmup):
            subject.step()
    progress.phase(label)
    block = budget.per_block()
    samples: list[list[int]] = [[] for _ in subjects]
    clock = time.perf_counter_ns
    for k, order in enumerate(_rotations(len(subjects), budget.blocks)):
        for i in order:
            step, mine = subjects[i].step, samples[i]
            for _ in range(budget.settle):
                step()
            count, start = 0, time.perf_counter()
            while not block.done(count, time.perf_counter() - start):
                t0 = clock()
                step()
                mine.append(clock() - t0)
                count += 1
        progress.update((k + 1) / budget.blocks)
    progress.done()
    if budget.niter is not None:  # blocks round up: keep exactly niter samples each
        samples = [s[: budget.niter] for s in samples]
    return [LatencyStats.from_samples(s) for s in samples]


def measure_throughput(subjects: Sequence[Subject], budget: Budget, progress: Progress = NO_PROGRESS,
                       label: str = "throughput") -> list[ThroughputStats]:
    """Inferences per second of each subject with its requests in flight, in alternating blocks."""
    progress.phase(label)
    for subject in subjects:  # warm-up: every request used a few times
        subject.run_jobs(Budget(niter=max(1, budget.warmup) * subject.requests, time_s=None))
    block = budget.per_block()
    counts = [0] * len(subjects)
    seconds = [0.0] * len(subjects)
    rates: list[list[float]] = [[] for _ in subjects]
    for k, order in enumerate(_rotations(len(subjects), budget.blocks)):
        for i in order:
            count, elapsed = subjects[i].run_jobs(block)
            counts[i] += count
            seconds[i] += elapsed
            rates[i].append(count / elapsed if elapsed > 0 else 0.0)
        progress.update((k + 1) / budget.blocks)
    progress.done()
    return [ThroughputStats(s.requests, c, e, c / e if e > 0 else 0.0, tuple(r))
            for s, c, e, r in zip(subjects, counts, seconds, rates)]


def paired_difference_ms(a: LatencyStats, b: LatencyStats) -> float:
    """The median of a[k] - b[k] over samples taken in the same blocks (milliseconds): what a adds over b, call
    for call. Meaningful for an ``niter`` budget (equal counts per block)."""
    n = min(len(a.samples_ns), len(b.samples_ns))
    if not n:
        raise ValueError("paired_difference_ms needs the samples of both subjects")
    return statistics.median(x - y for x, y in zip(a.samples_ns[:n], b.samples_ns[:n])) / 1e6


def paired_ratio(a: ThroughputStats, b: ThroughputStats) -> float | None:
    """The median of a's rate over b's, block by block (None where b never ran)."""
    pairs = [x / y for x, y in zip(a.block_fps, b.block_fps) if y > 0]
    return statistics.median(pairs) if pairs else None


def keep_in_flight(runner: Any, sets: Sequence[tuple[list[Any], list[Any]]], budget: Budget) -> tuple[int, float]:
    """``execute_async`` keeping one job per tensor set in flight (waiting for the oldest when every set is busy)
    until the budget is spent: (jobs done, seconds)."""
    free = deque(sets)
    running: deque[tuple[Any, tuple[list[Any], list[Any]]]] = deque()
    started = done = 0

    def collect() -> None:
        nonlocal done
        job, used = running.popleft()
        status = runner.wait(job, None)
        if status is not StatusCode.SUCCESS:
            raise BenchError(f"async job failed: {status.name}: {runner.last_error}")
        done += 1
        free.append(used)

    start = time.perf_counter()
    while not budget.done(started, time.perf_counter() - start):
        if not free:
            collect()
            continue
        ins, outs = free[0]
        job = runner.execute_async([ins], [outs])
        if job.status is StatusCode.SUCCESS:
            running.append((job, free.popleft()))
            started += 1
        elif job.status is StatusCode.RESOURCE_UNAVAILABLE:  # every run busy: free one of ours, or let one end
            if running:
                collect()
            else:
                time.sleep(0)
        else:
            raise BenchError(f"execute_async failed: {job.status.name}: {runner.last_error}")
    while running:
        collect()
    return done, time.perf_counter() - start


__all__ = ["BenchError", "Budget", "CallSubject", "NO_PROGRESS", "Progress", "Subject", "keep_in_flight",
           "measure_latency", "measure_throughput", "paired_difference_ms", "paired_ratio", "stopwatch"]
