"""Delivery of job callbacks on npurt's own threads, for the job scheduler (``jobs.py``, whose docstring gives the
contract): in completion order on as many callback threads as there can be jobs in flight, or in submission order
on one. The scheduler's lock guards this state too: every method named ``*_locked`` is called under it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, Protocol

from .types import JobHandle, StatusCode

log = logging.getLogger("npurt")


class CallbackJob(Protocol):
    """What delivery needs of a job: its id, outcome, callback and place among jobs with callbacks."""

    job_id: int
    status: StatusCode
    error: str
    seq: int
    callback: Callable[[JobHandle], Any] | None


class CallbackDelivery:
    """The callback threads of one scheduler and the callbacks queued for them."""

    def __init__(self, lock: threading.Lock, ordered: bool, wanted: int, name: str,
                 collected: Callable[[int], Any]) -> None:
        """``lock``: the scheduler's; ``ordered``: submission order (one thread), else completion order (up to
        ``wanted`` threads); ``collected(job_id)``: the job is done with (called once its callback returned)."""
        self._lock = lock
        self.ordered = ordered
        self._wanted = 1 if ordered else wanted  # one thread keeps the order
        self._name = name
        self._collected = collected
        self.before_callback: Callable[[str], None] | None = None  # given the job's message (last_error) first
        self._due = 0  # next sequence number to deliver (submission order)
        self._ready: dict[int, CallbackJob] = {}
        self._queue: SimpleQueue[CallbackJob | None] = SimpleQueue()
        self.threads: list[threading.Thread] = []
        self._idle = 0  # callback threads waiting for a callback
        self._queued = 0  # callbacks queued and not yet taken

    def queue_locked(self, job: CallbackJob) -> None:
        """(under the lock) Queue an ended job's callback, in its order; a thread more where all are busy."""
        if self.ordered:
            self._ready[job.seq] = job
            while self._due in self._ready:
                self._queue.put(self._ready.pop(self._due))
                self._queued += 1
                self._due += 1
        else:
            self._queue.put(job)
            self._queued += 1
        if self._queued > self._idle and len(self.threads) < self._wanted:
            thread = threading.Thread(target=self._deliver, name=f"{self._name}-callback-{len(self.threads)}",
                                      daemon=True)
            self.threads.append(thread)
            self._idle += 1
            thread.start()

    def call(self, job: CallbackJob) -> None:
        """A job's callback, after ``before_callback``; an exception is logged (the thread lives on)."""
        try:
            if self.before_callback is not None:
                self.before_callback(job.error)
            if job.callback is not None:
                job.callback(JobHandle(job.status, job.job_id))
        except Exception:  # noqa: BLE001 - a raising callback must not kill the thread
            log.exception("callback of job %d raised", job.job_id)

    def _deliver(self) -> None:
        get = self._queue.get
        while True:
            job = get()
            if job is None:
                return
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            try:
                self.call(job)
            finally:
                self._collected(job.job_id)
                with self._lock:
                    self._idle += 1
            job = None  # an idle thread must not keep its last job (and the callback's references) alive

    def close(self) -> None:
        """Deliver every queued callback, then end the threads (a callback thread closing its runner: not itself)."""
        with self._lock:
            threads = list(self.threads)
        for _ in threads:
            self._queue.put(None)  # behind every queued callback
        me = threading.current_thread()
        for thread in threads:
            if thread is not me:
                thread.join()
