"""Delivery of job callbacks on npurt's own threads, for the job scheduler (``jobs.py``, whose docstring gives the
contract): in completion order on as many callback threads as there can be jobs in flight, or in submission order
on one. The scheduler's lock guards this state too: every method named ``*_locked`` is called under it."""

from __future__ import annotations

import logging
import threading
import weakref
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
        # (a queued callback holds its delivery: an ended job no longer holds its scheduler)
        self._queue: SimpleQueue[tuple[CallbackDelivery, CallbackJob] | None] = SimpleQueue()
        self.threads: list[threading.Thread] = []
        self._idle = 0  # callback threads waiting for a callback
        self._queued = 0  # callbacks queued and not yet taken
        # callback threads hold this only while they deliver (see the scheduler's workers)
        self._end_threads = weakref.finalize(self, end_threads, self._queue, self.threads)
        self._end_threads.atexit = False

    def queue_locked(self, job: CallbackJob) -> None:
        """(under the lock) Queue an ended job's callback, in its order; a thread more where all are busy."""
        if self.ordered:
            self._ready[job.seq] = job
            while self._due in self._ready:
                self._queue.put((self, self._ready.pop(self._due)))
                self._queued += 1
                self._due += 1
        else:
            self._queue.put((self, job))
            self._queued += 1
        if self._queued > self._idle and len(self.threads) < self._wanted:
            thread = threading.Thread(target=_deliver, args=(self._queue.get,),
                                      name=f"{self._name}-callback-{len(self.threads)}", daemon=True)
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

    def deliver(self, job: CallbackJob) -> None:
        """(on a callback thread) A queued callback, then the job out of the scheduler's table."""
        with self._lock:
            self._idle -= 1
            self._queued -= 1
        try:
            self.call(job)
        finally:
            self._collected(job.job_id)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Deliver every queued callback, then end the threads (a callback thread closing its runner: not itself)."""
        with self._lock:
            threads = self.threads[:]
            self.threads.clear()  # (the finalizer's list: nothing left for it to end)
        for _ in threads:
            self._queue.put(None)  # behind every queued callback
        me = threading.current_thread()
        for thread in threads:
            if thread is not me:
                thread.join()


def _deliver(get: Callable[[], tuple[CallbackDelivery, CallbackJob] | None]) -> None:
    """A callback thread: deliver queued callbacks until the sentinel, holding the delivery only meanwhile."""
    while True:
        item = get()
        if item is None:
            return
        delivery, job = item
        delivery.deliver(job)
        del item, job, delivery  # an idle thread keeps nothing of its last job (the callback's references)


def end_threads(queue: SimpleQueue[Any], threads: list[threading.Thread]) -> None:
    """The sentinel for each thread of a collected scheduler or delivery (its finalizer: SimpleQueue.put is safe
    there, whichever thread the collector runs on)."""
    for _ in threads:
        queue.put(None)
