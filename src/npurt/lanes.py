"""Engines' job lanes as one runner's scheduler holds them (``engine.JobLane``, ``Engine.lane``).

A lane keeps the table of the jobs on it (ids, runs, outcomes, counts) in native code: a job without a callback on an
engine that has one is submitted (``reserve`` under the scheduler's lock, so that ``max_concurrent`` counts every
kind of job, then ``launch``) and collected by its waiter with no Python object made for it. Where the scheduler must
hold such a job as its own (at close; in a ``wait_any`` over jobs of several kinds or lanes), the lane hands it over
(``take``) and a ``LaneRun`` collects it for the scheduler's job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .engine import JobLane, Launched
from .stats import RunnerStats
from .status import JOB_PENDING, SUCCESS, status_of
from .types import StatusCode

Translate = Callable[[BaseException], BaseException]  # a job's message as its engine's error
End = Callable[[BaseException | None, None, bool], None]  # a taken job's end: its error, shapes, counted by its lane
WAIT_MS = 100  # untimed waits wait in slices, so that KeyboardInterrupt reaches a waiting main thread


def _outcome(message: str, translate: Translate) -> tuple[StatusCode, str]:
    return (SUCCESS, "") if message == "" else status_of(translate(RuntimeError(message)), 0)


class LaneRun(Launched):
    """A lane's job that the scheduler holds as its own (taken from the lane): its waiters collect it from the lane
    and end the scheduler's job (``end``)."""

    __slots__ = ("lane", "job_id", "end", "translate", "counted")

    def __init__(self, lane: JobLane, job_id: int, end: End, translate: Translate, counted: bool) -> None:
        self.lane, self.job_id, self.end, self.translate, self.counted = lane, job_id, end, translate, counted

    def wait(self, timeout_s: float | None) -> bool:
        collect, job_id = self.lane.collect, self.job_id
        if timeout_s is None:
            while (message := collect(job_id, WAIT_MS, True)) is None:
                pass
        elif (message := collect(job_id, _ms(timeout_s), True)) is None:
            return False
        if message is not False:  # (False: forgotten: the thread that ended the job did)
            self.ended(message)
        return True

    def ended(self, message: str) -> None:
        """End the scheduler's job from its outcome, then let the lane forget the outcome (a taken job's stays in
        the lane until then: an interruption between the two leaves it for the next wait)."""
        self.end(None if message == "" else self.translate(RuntimeError(message)), None, self.counted)
        self.lane.forget(self.job_id)

    def wait_any(self, others: Sequence[Launched], timeout_s: float) -> bool | None:
        """This run or any of ``others`` (runs of the same lane) waited for in the lane."""
        runs = [self]
        for r in others:
            if type(r) is not LaneRun or r.lane is not self.lane:
                return None
            runs.append(r)
        got = self.lane.collect_any([r.job_id for r in runs], _ms(timeout_s), True)
        if got is None:
            return False
        job_id, message = got
        if message is not False:
            for r in runs:
                if r.job_id == job_id:
                    r.ended(message)
        return True


def _ms(timeout_s: float) -> int:
    """A timeout in whole ms for a lane's wait (at most a day: the lane waits no longer in one call)."""
    return math.ceil(min(timeout_s, 86400.0) * 1000)


_ID_MAX = 2**63  # job ids a lane takes (int64); a larger one is no lane's


class Lanes:
    """The lanes one runner's jobs went to, each with its engine's error translation; their counts join the
    runner's stats. Added to under the scheduler's lock; read anywhere (a list only appended to)."""

    def __init__(self, stats: RunnerStats) -> None:
        self.known: list[tuple[JobLane, Translate]] = []
        self.last: JobLane | None = None  # the lane of the last submission (the one check on every job's path)
        self._stats = stats
        self._counts: list[Callable[[], tuple[int, int, int]]] = []  # each lane's counts, as the stats hold them

    def add(self, lane: JobLane, translate: Translate) -> None:
        self.last = lane
        if all(known is not lane for known, _ in self.known):
            self.known.append((lane, translate))
            counts = lane.counts
            self._counts.append(counts)
            self._stats.count_jobs_of(counts)

    def close(self) -> None:
        """Let go of the lanes (their jobs taken and ended: the runner is closed), their counts kept in the stats:
        nothing of the engines stays reachable from the scheduler."""
        for counts in self._counts:
            self._stats.settle_jobs_of(counts)
        self._counts = []
        self.known = []
        self.last = None

    def running(self, but: JobLane | None = None) -> int:
        """Jobs running on the lanes (but one's)."""
        if not self.known:  # (no lane: every job's path on engines without one)
            return 0
        return sum(lane.running() for lane, _ in self.known if lane is not but)

    def uncollected(self) -> int:
        return sum(lane.uncollected() for lane, _ in self.known)

    def take(self, job_id: int) -> tuple[JobLane, Translate, bool] | None:
        """Hand a lane's job to the scheduler: its lane, translation and whether the lane counted its end (None:
        no lane holds it)."""
        if not -_ID_MAX <= job_id < _ID_MAX:
            return None
        for lane, translate in self.known:
            counted = lane.take(job_id)
            if counted is not None:
                return lane, translate, counted
        return None

    def wait(self, job_id: int, timeout_s: float | None) -> tuple[StatusCode, str] | None:
        """Wait for a lane's job and collect it: its status and message; None where no lane holds it. (The wait in
        slices is written out here and in ``wait_any`` and ``LaneRun``, not shared: a call more costs 0.1 us a job.)"""
        try:
            for lane, translate in self.known:
                if timeout_s is None:
                    while (message := lane.collect(job_id, WAIT_MS, False)) is None:
                        pass
                elif (message := lane.collect(job_id, _ms(timeout_s), False)) is None:
                    return StatusCode.JOB_PENDING, f"job {job_id} is still running"
                if message is not False:
                    return _outcome(message, translate)
        except TypeError:  # an id beyond the lanes' int64: no lane's
            pass
        return None

    def wait_any(self, job_ids: Sequence[int], timeout_s: float | None) -> tuple[StatusCode, int, str] | None:
        """Wait for whichever of jobs of the one lane ends first and collect it; None where the runner has several
        lanes or the lane holds not every one of them (nothing collected then)."""
        known = self.known  # (one reading: close() replaces the list)
        if len(known) != 1 or not job_ids:
            return None
        lane, translate = known[0]
        try:
            if timeout_s is None:
                while (got := lane.collect_any(job_ids, WAIT_MS, False)) is None:
                    pass
            elif (got := lane.collect_any(job_ids, _ms(timeout_s), False)) is None:
                return JOB_PENDING, 0, f"none of jobs {list(job_ids)} has ended"
        except TypeError:  # an id beyond the lanes' int64: no lane's
            return None
        job_id, message = got
        if message is False:
            return None
        status, text = _outcome(message, translate)
        return status, job_id, text

    def jobs(self) -> list[int]:
        """Jobs in the lanes not yet collected nor taken."""
        return [job_id for lane, _ in self.known for job_id in lane.jobs()]
