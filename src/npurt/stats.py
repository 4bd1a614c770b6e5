"""A runner's counters: host copies of tensor data, executes, jobs and compiles, since the runner was made.

The counters of events (executes, jobs and their failures) are ``itertools.count`` objects: ``next()`` on one is a
single C call under the GIL, so counting an execute or a job takes no lock (this is on every run's path). Counters
that add amounts (bytes copied, with the copies beside them) keep a lock."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable

COUNTERS = ("copies", "bytes_copied", "executes", "execute_failures", "jobs_submitted", "jobs_completed",
            "jobs_failed", "compiles")
_EVENTS = ("executes", "execute_failures", "jobs_submitted", "jobs_completed", "jobs_failed")


def _value(counter: itertools.count[int]) -> int:
    """How many times ``next`` was called on a counter made as ``itertools.count()`` (its repr: ``count(N)``)."""
    return int(repr(counter)[6:-1])


class RunnerStats:
    """Thread-safe totals; ``snapshot()`` gives them as a dict (``Runner.stats``)."""

    __slots__ = ("_lock", "_counts", "_events", "_jobs_elsewhere", "_settled", "execute_ended", "execute_failed",
                 "job_submitted", "job_completed", "job_failed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {name: 0 for name in COUNTERS if name not in _EVENTS}
        self._events = {name: itertools.count() for name in _EVENTS}
        # jobs counted where they run (an engine's job lane): (submitted, completed, failed), added to the totals
        self._jobs_elsewhere: list[Callable[[], tuple[int, int, int]]] = []
        self._settled = (0, 0, 0)  # what such counters counted before they were let go of
        events = self._events
        # one execute or job submitted / completed / failed: C calls (a partial of next), no Python frame each
        self.execute_ended: Callable[[], int] = functools.partial(next, events["executes"])
        self.execute_failed: Callable[[], int] = functools.partial(next, events["execute_failures"])
        self.job_submitted: Callable[[], int] = functools.partial(next, events["jobs_submitted"])
        self.job_completed: Callable[[], int] = functools.partial(next, events["jobs_completed"])
        self.job_failed: Callable[[], int] = functools.partial(next, events["jobs_failed"])

    def add(self, name: str, n: int = 1) -> None:
        counter = self._events.get(name)
        if counter is not None:
            for _ in range(n):
                next(counter)
            return
        with self._lock:
            self._counts[name] += n

    def copy(self, nbytes: int) -> None:
        """One host-side copy of tensor data (a conversion into or out of staging, a filled alias, ...)."""
        with self._lock:
            self._counts["copies"] += 1
            self._counts["bytes_copied"] += int(nbytes)

    def count_jobs_of(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        """Add the jobs another counter counts, (submitted, completed, failed), to the totals from now on."""
        with self._lock:
            self._jobs_elsewhere.append(counts)

    def settle_jobs_of(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        """Keep what ``counts`` (given to ``count_jobs_of``) has counted, and let go of it."""
        with self._lock:
            if counts in self._jobs_elsewhere:
                self._jobs_elsewhere.remove(counts)
                (a, b, c), (x, y, z) = self._settled, counts()
                self._settled = (a + x, b + y, c + z)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            counts = dict(self._counts)
            elsewhere = [source() for source in self._jobs_elsewhere]
            elsewhere.append(self._settled)
        counts.update((name, _value(c)) for name, c in self._events.items())
        for numbers in elsewhere:
            for name, n in zip(("jobs_submitted", "jobs_completed", "jobs_failed"), numbers):
                counts[name] += n
        return {name: counts[name] for name in COUNTERS}
