"""Requests' inputs gathered into runs by tokens: ``concurrent_runs`` threads per served model each take requests
waiting, in the order they came, while their tokens fit ``max_batch_tokens`` (the first always), run them as one
call and hand each request its rows. Concurrent clients thus share a run, as text-embeddings-inference batches them;
a run's result rows are the rows each input gives alone (the Embedder pads within a batch with the mask: exact).

No window is waited for: a run starts as soon as a thread is free and a request waits, and the requests that come
while it runs make the next one. With several threads (an engine made for several runs at once: ``--hint
throughput``), the threads free at once share what waits, by tokens, so that every core has work: on a 2-core CPU
two one-thread runs of a few short sentences each do more than one two-thread run of them all (its intra-op threads
wait on each other at every operator of so small a batch).

But a thread that comes free while another run is in progress, with fewer than ``gather_inputs`` inputs waiting,
waits up to ``gather_seconds`` for more first (the run in progress keeps one core busy; the waiting thread's core
meanwhile serves the clients and the event loop, which make those requests): eight one-sentence clients on 2 cores
otherwise got mostly one-row runs, each paying a run's own cost (a run of one 16-token row costs 7.4 ms on one
thread, 4.7 ms a row in a run of eight), and the server with fewer runs and thread switches took ~4% less CPU (with
its clients) for the same requests. A lone request (no other run in progress) never waits."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..openai.errors import ApiError

log = logging.getLogger("npurt.serve")

RECENT_RUNS = 64  # the sizes of the last runs, kept for /v1/models and the tests
GATHER_INPUTS = 3  # a thread free beside a run in progress waits for this many inputs...
GATHER_SECONDS = 0.004  # ...at most this long (under a one-row run's time on one thread: 7-14 ms)


@dataclass
class _Job:
    ids: list[list[int]]
    tokens: int
    future: Future[np.ndarray] = field(default_factory=Future)


class TokenBatcher:
    """Runs ``run(ids) -> [n, dim]`` over the inputs of the requests submitted, gathered by tokens, at most
    ``concurrent_runs`` runs at once (``run`` must then be safe to call from several threads). ``gather_inputs``,
    ``gather_seconds``: what a thread free beside a run in progress waits for, and how long at most (0: never)."""

    def __init__(self, name: str, run: Callable[[Sequence[Sequence[int]]], np.ndarray], max_batch_tokens: int,
                 max_queue: int, concurrent_runs: int = 1, gather_inputs: int = GATHER_INPUTS,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        if concurrent_runs < 1:
            raise ValueError(f"concurrent_runs: at least 1, got {concurrent_runs}")
        if gather_inputs < 1 or not 0 <= gather_seconds <= 60:
            raise ValueError(f"gather_inputs: at least 1, gather_seconds: 0 to 60 s; got {gather_inputs}, "
                             f"{gather_seconds}")
        self.name, self._run = name, run
        self.max_batch_tokens, self.max_queue, self.concurrent_runs = max_batch_tokens, max_queue, concurrent_runs
        self.gather_inputs, self.gather_seconds = gather_inputs, gather_seconds
        self._queue: deque[_Job] = deque()
        self._waiting_tokens = 0  # the tokens of the jobs in _queue
        self._waiting_inputs = 0  # their inputs
        self._cond = threading.Condition()
        self._running = 0  # runs in progress
        self._refusing = ""
        self._closed = False
        self.runs = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=RECENT_RUNS)  # (requests, inputs) of each run
        self._threads = [threading.Thread(target=self._loop, name=f"npurt-embed-{name}-{k}", daemon=True)
                         for k in range(concurrent_runs)]
        for thread in self._threads:
            thread.start()

    def submit(self, ids: list[list[int]]) -> Future[np.ndarray]:
        """The request's rows, once its run has run (ApiError 429 / 503 where it is refused)."""
        job = _Job(ids, sum(len(i) for i in ids))
        with self._cond:
            if self._refusing:
                raise ApiError(503, self._refusing, retry_after=1)
            if len(self._queue) >= self.max_queue:
                raise ApiError(429, f"model {self.name!r} has {len(self._queue)} requests waiting, its limit "
                                    "(--max-queue): try again shortly", retry_after=1)
            self._queue.append(job)
            self._waiting_tokens += job.tokens
            self._waiting_inputs += len(ids)
            self._cond.notify_all()  # (a thread gathering, or one idle: either may be the one waiting)
        return job.future

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._queue) + self._running

    def _take(self) -> list[_Job] | None:
        with self._cond:
            while True:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                self._gather()
                if self._queue:  # (another free thread may have taken it; once closed it is empty: None above)
                    break
            # this thread's share of what waits: all of it with one thread free, half with two... (by tokens)
            free = self.concurrent_runs - self._running
            share = min(self.max_batch_tokens, -(-self._waiting_tokens // free))
            jobs = [self._queue.popleft()]
            tokens = jobs[0].tokens
            while self._queue and tokens < share and tokens + self._queue[0].tokens <= self.max_batch_tokens:
                tokens += self._queue[0].tokens
                jobs.append(self._queue.popleft())
            self._waiting_tokens -= tokens
            self._waiting_inputs -= sum(len(job.ids) for job in jobs)
            self._running += 1
            if self._queue:
                self._cond.notify()  # another free thread takes the rest
            return jobs

    def _gather(self) -> None:
        """Beside a run in progress, wait (up to gather_seconds) until gather_inputs inputs wait; called holding
        the lock, with a request waiting. Ends at once where that run ends (its thread is then free too)."""
        if self.gather_seconds <= 0 or not self._running or self._waiting_inputs >= self.gather_inputs:
            return
        deadline = time.monotonic() + self.gather_seconds
        while self._running and self._waiting_inputs < self.gather_inputs and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _loop(self) -> None:
        while (jobs := self._take()) is not None:
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            try:
                if jobs:
                    rows = self._run([ids for job in jobs for ids in job.ids])
                    with self._cond:
                        self.runs += 1
                        self.recent.append((len(jobs), len(rows)))
                    start = 0
                    for job in jobs:
                        job.future.set_result(rows[start:start + len(job.ids)])
                        start += len(job.ids)
            except Exception as e:  # noqa: BLE001 - every request of the run is told; the thread goes on
                log.exception("embedding model %s: a run of %d requests failed", self.name, len(jobs))
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def refuse_new(self, why: str) -> None:
        with self._cond:
            self._refusing = why

    def drain(self, deadline: float) -> bool:
        with self._cond:
            while self._queue or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, why: str) -> None:
        with self._cond:
            self._closed = True
            self._refusing = self._refusing or why
            waiting = list(self._queue)
            self._queue.clear()
            self._waiting_tokens = self._waiting_inputs = 0
            self._cond.notify_all()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ApiError(503, why))
        for thread in self._threads:
            thread.join(timeout=30)


__all__ = ["TokenBatcher"]
