"""A runner's counters: host copies of tensor data, executes, jobs and compiles, since the runner was made."""

from __future__ import annotations

import threading

COUNTERS = ("copies", "bytes_copied", "executes", "execute_failures", "jobs_submitted", "jobs_completed",
            "jobs_failed", "compiles")


class RunnerStats:
    """Thread-safe totals; ``snapshot()`` gives them as a dict (``Runner.stats``)."""

    __slots__ = ("_lock", "_counts")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def copy(self, nbytes: int) -> None:
        """One host-side copy of tensor data (a conversion into or out of staging, a filled alias, ...)."""
        with self._lock:
            self._counts["copies"] += 1
            self._counts["bytes_copied"] += int(nbytes)

    def executed(self, ok: bool) -> None:
        with self._lock:
            self._counts["executes"] += 1
            if not ok:
                self._counts["execute_failures"] += 1

    def job_ended(self, ok: bool) -> None:
        with self._lock:
            self._counts["jobs_completed"] += 1
            if not ok:
                self._counts["jobs_failed"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
