"""Measurement loops shared by the overhead benchmarks (npurt against a raw engine, side by side, one run).

On a shared 2-core machine a subject's speed drifts from second to second, so nothing here times one subject
after the other: latency subjects take turns in short blocks, throughput subjects in alternating blocks, and
ratios are taken per pair of neighbouring blocks.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from npurt import StatusCode


def interleaved(fns: Sequence[Callable[[], None]], iterations: int, blocks: int = 10) -> list[list[float]]:
    """``iterations`` timed calls (seconds) of each function, run in short blocks that take turns.

    The order rotates from block to block, so no function always runs right after another. Not call by call:
    after a run an engine's thread pool may spin-wait for more work (ONNX Runtime's intra-op threads do), and
    another session's first call right after competes with it for the cores (on this 2-core machine that made
    the PP-OCR detector look 35% faster through npurt than through InferenceSession.run, while either alone
    runs in the same time). The first call of each block is not timed.
    """
    for _ in range(max(5, iterations // 20)):
        for f in fns:
            f()
    samples: list[list[float]] = [[] for _ in fns]
    clock = time.perf_counter
    n = len(fns)
    per_block = max(1, -(-iterations // blocks))
    for k in range(blocks):
        for m in range(n):
            i = (k + m) % n
            fns[i]()
            for _ in range(per_block):
                t0 = clock()
                fns[i]()
                samples[i].append(clock() - t0)
    return samples


def p50_us(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1e6


def paired_p50_us(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of paired differences a[k] - b[k] (microseconds): what a adds over b, call for call."""
    return statistics.median(x - y for x, y in zip(a, b)) * 1e6


def keep_in_flight(runner: Any, sets: Sequence[tuple[list[Any], list[Any]]], n: int) -> float:
    """Inferences per second of ``n`` execute_async jobs, one per tensor set in flight (waiting for the
    oldest when every set is busy)."""
    t0 = time.perf_counter()
    free = deque(sets)
    running: deque = deque()
    for _ in range(n):
        if not free:
            job, used = running.popleft()
            if runner.wait(job) is not StatusCode.SUCCESS:
                raise RuntimeError(f"job: {runner.last_error}")
            free.append(used)
        ins, outs = free.popleft()
        job = runner.execute_async([ins], [outs])
        if job.status is not StatusCode.SUCCESS:
            raise RuntimeError(f"execute_async: {job.status.name}: {runner.last_error}")
        running.append((job, (ins, outs)))
    for job, _ in running:
        runner.wait(job)
    return n / (time.perf_counter() - t0)


def alternating(run_a: Callable[[int], float], run_b: Callable[[int], float], jobs: int, blocks: int
                ) -> tuple[float, float, float]:
    """Throughput of two subjects (each ``run(n) -> inferences/s``) in alternating blocks of ``jobs``.

    Returns the medians of both and the median of the per-pair ratios a/b, which is robust to load that drifts
    between pairs of blocks (the ratio of the two medians is not: here a block can run 30% slower than its
    neighbours).
    """
    run_a(max(4, jobs // 10))
    run_b(max(4, jobs // 10))
    a, b = [], []
    for k in range(blocks):
        if k % 2 == 0:
            a.append(run_a(jobs))
            b.append(run_b(jobs))
        else:
            b.append(run_b(jobs))
            a.append(run_a(jobs))
    return statistics.median(a), statistics.median(b), statistics.median(p / q for p, q in zip(a, b))
