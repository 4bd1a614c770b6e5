"""The job scheduler behind ``execute_async`` / ``wait`` / ``wait_any`` and job callbacks.

A job is one asynchronous run. It either starts on the engine's own asynchronous requests, or runs on one of the
scheduler's worker threads. An engine-started job ends through the engine's completion callback, or, where the
engine returns a ``Launched`` (OpenVINO), through its waiter: ``wait`` waits in the engine itself (GIL released)
and ends the job there, as a user of the engine waits for a request, with no thread woken for it; ``wait_any``
over such jobs waits on the oldest in slices of ``ANY_SLICE_S``, looking at the others between slices; a
submission that finds every run busy first ends those that have ended, and ``close`` waits for them.
At most ``max_concurrent`` jobs are in flight: beyond that ``submit`` answers RESOURCE_UNAVAILABLE, which is
transient. Job ids start at 1.

Each job holds a plain lock from submission until it has its final status: waiting on it blocks without the GIL
and costs no Condition machinery. ``wait_any`` registers one lock with the set of job ids it waits on, once,
whatever their number; a job that ends releases the locks of the waits whose sets hold it.

Callbacks run on npurt's own threads, never on an engine library's. The contract is OpenVINO's
``AsyncInferQueue``'s: a callback may submit jobs and may wait for them through npurt's own waits (``wait``,
``wait_any``, an InferQueue's), never by other means (its own lock, event or future). That lets a worker run the
first job its callback submits as its own next job (a continuation), with no other thread woken for it; where the
callback then waits through npurt, the worker hands the continuation to the other workers first, so that nothing
deadlocks. ``callback_order``:
- "completion": as jobs end, on the worker that ran the job, so that a job's end reaches its callback with no
  further hand-off; jobs started on an engine's own machinery (which ends them on threads where no user code
  runs) have theirs on callback threads, as many as there are jobs in flight. A callback may resubmit, wait on
  another job, or raise (the exception is logged and the thread lives on): while workers are in callbacks, more
  workers start, so that queued jobs never wait for a callback to return;
- "submission": in submission order, one after the other, on one callback thread.
A job with a callback is released from the job table after its callback returns; during the callback the runner's
``last_error`` on that thread is the job's message. Callback threads and their queue: ``callbacks.py``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from queue import SimpleQueue
from typing import Any

from .callbacks import CallbackDelivery, end_threads
from .engine import Done, JobLane, Launched
from .lanes import LaneRun, Lanes, Translate
from .stats import RunnerStats
from .status import JOB_PENDING, SUCCESS, StatusError, status_of
from .types import JobHandle, StatusCode

Work = Callable[..., tuple[StatusCode, str]]  # a job run on a worker (called with its args): never raises
# start on the engine, given the job's end (called with the run's error, and what the engine tells besides, which
# is the starter's to use: ignored here); False: cannot now
Start = Callable[[Done], bool | Launched]
Callback = Callable[[JobHandle], Any]

# A worker running the callback of a job it ran: its scheduler, and the continuation that callback submitted (the
# worker's next job). Module-wide, so that a wait of any runner, or of an InferQueue, can hand it over first.
_callback_thread = threading.local()

_QUEUED, _RUNNING, _DONE = 0, 1, 2
_SLICE_S = 0.1  # untimed waits block in slices, so that KeyboardInterrupt reaches a waiting main thread
ANY_SLICE_S = 0.001  # wait_any over jobs ended by their waiter: how long it waits on one before looking at the rest


class Job:
    """One asynchronous run and its outcome."""

    __slots__ = ("job_id", "callback", "seq", "done", "status", "error", "state", "ended", "on_worker", "launched",
                 "scheduler", "keep")

    def __init__(self, job_id: int, callback: Callback | None, seq: int, scheduler: JobScheduler) -> None:
        self.scheduler: JobScheduler | None = scheduler  # until the job ends (the table refers to the job)
        self.job_id = job_id
        self.callback = callback
        self.seq = seq  # place among the jobs with callbacks, for callback_order="submission"
        # held until the job has its final status: made by the first thread that must block on it (under the
        # scheduler's lock), never for a job its waiter ends in the engine (most engine-started jobs)
        self.done: threading.Lock | None = None
        self.status = JOB_PENDING
        self.error = ""
        self.state = _QUEUED
        self.ended = 0  # order of ending, for wait_any
        self.on_worker = False  # run by a worker (else started on the engine)
        self.launched: Launched | None = None  # started on the engine, ended by its waiter
        self.keep: Any = None  # a started job's call (its tensors): their memory stays while the engine runs it

    def block(self, timeout_s: float | None) -> bool:
        """Wait (GIL released) up to ``timeout_s`` (None: no limit) for the job to end; whether it has."""
        launched = self.launched
        if launched is not None and self.state != _DONE:
            if not launched.wait(timeout_s):
                return False
            if self.state == _DONE:  # (ended by this thread, most often)
                return True
            # else ended, and it has its status in a moment from the thread that saw its end
        done = self.done
        scheduler = self.scheduler
        if done is None:
            if scheduler is None:  # (ended: the scheduler lets go of a job as it ends it)
                return True
            with scheduler._lock:
                if self.state == _DONE:
                    return True
                done = self.done
                if done is None:
                    done = self.done = threading.Lock()
                    done.acquire()
        return _block(done, timeout_s) or self.state == _DONE

    def end(self, error: BaseException | None, _told: Any = None, counted: bool = False) -> None:
        """The engine's ``Done`` for a job started on it (its bound method: nothing made per job to say which job):
        the job's final status from the run's error; what the engine tells besides is the starter's to use.
        ``counted``: its end is in the stats already (a job lane counted it)."""
        status, message = (SUCCESS, "") if error is None else status_of(error, 0)
        scheduler = self.scheduler
        if scheduler is None:  # ended already
            return
        lock = scheduler._lock
        lock.acquire()
        try:
            scheduler._finish_locked(self, status, message, counted=counted)  # (not a worker: no inline callback)
        finally:
            lock.release()


def _unknown(job_id: int) -> str:
    return f"job {job_id} is unknown to this runner or was already collected"


def _first_ended(jobs: list[Job]) -> Job | None:
    """Of these jobs, the first to have ended (None: none has)."""
    first = None
    for job in jobs:
        if job.state == _DONE and (first is None or job.ended < first.ended):
            first = job
    return first


def _block(lock: threading.Lock, timeout_s: float | None) -> bool:
    """Acquire-and-release ``lock`` within ``timeout_s`` (None: no limit); whether it was free in time."""
    if timeout_s is None:
        while not lock.acquire(True, _SLICE_S):
            pass
    elif not lock.acquire(True, timeout_s):
        return False
    lock.release()  # leave it free: every later wait returns at once
    return True


class JobScheduler:
    """The job table, the workers and the callback threads of one runner."""

    def __init__(self, max_concurrent: int, workers: int, callback_order: str, stats: RunnerStats,
                 name: str = "npurt") -> None:
        self.max_concurrent = max_concurrent
        self._worker_count = workers
        self._stats = stats
        self._name = name
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}
        self._running = 0  # jobs submitted and not yet ended
        self._next_id = 1
        self._next_seq = 0
        self._ended = 0
        self._closed = False
        self._queue: SimpleQueue[tuple[Job, Work, tuple[Any, ...]] | None] = SimpleQueue()
        self._workers: list[threading.Thread] = []
        jobs = self._jobs

        def collected(job_id: int) -> None:  # a job whose callback returned on a callback thread: out of the table
            jobs.pop(job_id, None)  # (not a method: the delivery holds no reference back to the scheduler)

        self.callbacks = CallbackDelivery(self._lock, callback_order == "submission", max_concurrent, name, collected)
        self._workers_in_callbacks = 0  # workers running the callback of the job they ran
        self._any_waits: list[tuple[set[int], threading.Lock]] = []  # wait_any calls: their job ids and lock
        self._lanes = Lanes(stats)  # engines' job lanes that jobs went to (Engine.lane)
        # workers hold their scheduler only while they run a job: a runner the app dropped unclosed is collected,
        # and this ends its workers (SimpleQueue.put is safe in a finalizer, whichever thread the collector is on)
        self._end_workers = weakref.finalize(self, end_threads, self._queue, self._workers)
        self._end_workers.atexit = False  # (at exit the runners still open are closed: runner.py)

    # -- submission ------------------------------------------------------------------------------------
    def submit(self, work: Work, args: tuple[Any, ...], start: Start | None, callback: Callback | None,
               on_accept: Callable[[], None] | None = None) -> Job:
        """Register a job and start it on the engine (``start``) or queue it for the workers (``work(*args)``: no
        object made for it per job where the engine starts it); the first job a worker's callback submits is that
        worker's next (see the module's docstring).

        ``on_accept`` runs under the scheduler's lock once the job is accepted, before it is queued (a stream takes
        its job's place in line there, so that places follow the queue's order). StatusError
        RESOURCE_UNAVAILABLE when ``max_concurrent`` jobs are in flight, FAILURE once closed."""
        if self._running + self._lanes.running() >= self.max_concurrent:
            self._reap()  # jobs that ended on the engine with no waiter yet
        lock = self._lock
        lock.acquire()  # (not `with`: this is every job's path, and acquire/release cost half as much)
        try:
            if self._closed:
                raise StatusError(StatusCode.FAILURE, "the runner is closed")
            if self._running + self._lanes.running() >= self.max_concurrent:
                raise StatusError(StatusCode.RESOURCE_UNAVAILABLE, f"all {self.max_concurrent} concurrent runs are "
                                                                   "busy; wait for one and retry")
            job_id = self._next_id
            self._next_id = job_id + 1
            job = Job(job_id, callback, self._next_seq, self)
            if callback is not None:
                self._next_seq += 1
            self._jobs[job_id] = job
            self._running += 1
            self._stats.job_submitted()
            if on_accept is not None:
                on_accept()
            if start is None:
                self._enqueue(job, work, args)
                return job
            job.state = _RUNNING
        finally:
            lock.release()
        try:
            started = start(job.end)
        except BaseException as e:  # noqa: BLE001 - the engine's error is the job's status
            self.finish(job, *status_of(e, 0))
            if not isinstance(e, Exception):
                raise  # KeyboardInterrupt and the like: the job has ended, the caller is told
            return job
        if started is not True and started:  # a Launched: its waiters end it
            job.keep = args  # (an engine's binding need not hold the tensors' memory: the job does, until collected)
            if job.state != _DONE:  # (else ended already, by a thread that found every run busy)
                job.launched = started
            return job
        if not started:
            with self._lock:
                if self._closed:
                    self._finish_locked(job, StatusCode.FAILURE, "the runner was closed before the job ran")
                else:
                    job.state = _QUEUED
                    self._enqueue(job, work, args)
        return job

    def submit_lane(self, lane: JobLane, arg: Any, translate: Translate, keep: Any, reap: bool = True) -> int:
        """A job on an engine's job lane (``Engine.lane``; no callback): its id, 0 where the lane has no free run
        (submit it the other way). Its table is the lane's until the scheduler must hold it (``_take``); the lane
        holds ``keep`` (the call's tensors) until the run is over.
        StatusError RESOURCE_UNAVAILABLE when ``max_concurrent`` jobs are in flight (``reap``: after ending those
        that ended unseen, first), FAILURE once closed."""
        lanes = self._lanes
        lock = self._lock
        reserved = 0
        lock.acquire()
        try:
            if self._closed:
                raise StatusError(StatusCode.FAILURE, "the runner is closed")
            if lane is not lanes.last:
                lanes.add(lane, translate)
            others = self._running if len(lanes.known) == 1 else self._running + lanes.running(but=lane)
            job_id = self._next_id
            reserved = lane.reserve(job_id, others, self.max_concurrent, arg)
            if reserved > 0:
                self._next_id = job_id + 1
        finally:
            lock.release()
            if reserved > 0:  # (here, so that nothing between the reservation and the start can leave a reserved
                lane.launch(job_id, arg, keep)  # run unstarted; a failure to start is the job's outcome)
        if reserved >= 0:
            return job_id if reserved else 0
        if reap:
            self._reap()  # jobs the scheduler holds that ended with no waiter yet free their place
            return self.submit_lane(lane, arg, translate, keep, False)
        raise StatusError(StatusCode.RESOURCE_UNAVAILABLE, f"all {self.max_concurrent} concurrent runs are busy; "
                                                           "wait for one and retry")

    def _take(self, job_id: int) -> Job | None:
        """(under _lock) A lane's job as the scheduler's own (None: no lane holds it): in the table, its waiters
        collecting it from the lane (LaneRun)."""
        taken = self._lanes.take(job_id)
        if taken is None:
            return None
        lane, translate, counted = taken
        job = Job(job_id, None, -1, self)
        job.state = _RUNNING
        job.launched = LaneRun(lane, job_id, job.end, translate, counted)
        self._jobs[job_id] = job
        self._running += 1
        return job

    def _enqueue(self, job: Job, work: Work, args: tuple[Any, ...]) -> None:
        """Queue for the workers (under _lock), starting them on the first job; the first job a worker's callback
        submits is that worker's next job instead (a continuation)."""
        here = _callback_thread.__dict__
        if here.get("scheduler") is self and here.get("next") is None:
            here["next"] = (job, work, args)
            return
        self._to_workers(job, work, args)

    def _to_workers(self, job: Job, work: Work, args: tuple[Any, ...]) -> None:
        # worker_count workers, plus one for each worker that is in a callback (which may wait for this job)
        wanted = self._worker_count + self._workers_in_callbacks
        while len(self._workers) < wanted:
            worker = threading.Thread(target=_work, args=(self._queue.get, self._lock),
                                      name=f"{self._name}-run-{len(self._workers)}", daemon=True)
            worker.start()
            self._workers.append(worker)
        self._queue.put((job, work, args))

    def _hand_over(self, job: Job, work: Work, args: tuple[Any, ...]) -> None:
        """A continuation given back to the workers (hand_over_continuation); once closed, it ends unrun."""
        with self._lock:
            if self._closed:
                self._finish_locked(job, StatusCode.FAILURE, "the runner was closed before the job ran")
            else:
                self._to_workers(job, work, args)

    def _reap(self) -> None:
        """End the jobs started on the engine whose runs have ended but that no waiter has ended yet."""
        launched = [j for j in list(self._jobs.values()) if j.launched is not None]
        for job in launched:
            started = job.launched
            if started is not None:
                started.wait(0)

    # -- completion --------------------------------------------------------------------------------------
    def finish(self, job: Job, status: StatusCode, message: str, on_worker: bool = False) -> None:
        """Give a job its final status; ``on_worker``: the caller is the worker that ran it, which runs the job's
        callback itself in completion order."""
        lock = self._lock
        lock.acquire()
        try:
            here = self._finish_locked(job, status, message, on_worker)
            if here:
                self._workers_in_callbacks += 1
        finally:
            lock.release()
        if here:
            self._run_inline(job)

    def _run_inline(self, job: Job) -> None:
        here = _callback_thread.__dict__
        here["scheduler"] = self
        try:
            self.callbacks.call(job)
        finally:
            here["scheduler"] = None
            self._jobs.pop(job.job_id, None)
            with self._lock:
                self._workers_in_callbacks -= 1

    def _finish_locked(self, job: Job, status: StatusCode, message: str, inline: bool = False,
                       counted: bool = False) -> bool:
        """Give a job its final status, free its run, wake its waiters, queue its callback (under _lock); True
        where the caller is to run the callback itself (``inline``, completion order)."""
        if job.state == _DONE:
            return False
        job.status, job.error, job.state = status, message, _DONE
        job.launched = None  # a Launched refers back to the job (its done): no cycle left
        job.scheduler = None  # nor through the table, for a job never collected (else the runner's engines would
        # wait for the garbage collector, which may destroy them on any thread, in the middle of another call)
        self._ended += 1
        job.ended = self._ended
        self._running -= 1
        if not counted:
            self._stats.job_completed()
            if status is not SUCCESS:
                self._stats.job_failed()
        if job.done is not None:
            job.done.release()
        for ids, waiter in self._any_waits:
            if job.job_id in ids and waiter.locked():
                waiter.release()
        if job.callback is None:
            return False
        callbacks = self.callbacks
        if inline and not callbacks.ordered:
            return True
        callbacks.queue_locked(job)
        return False

    # -- waiting --------------------------------------------------------------------------------------------
    def wait(self, job_id: int, timeout_s: float | None) -> tuple[StatusCode, str]:
        """The job's status once it has ended (collecting it), JOB_PENDING on timeout, INVALID_JOB_ID if unknown."""
        job = self._jobs.get(job_id)  # a single dict operation: atomic
        lanes = self._lanes
        if job is None and not lanes.known:
            return StatusCode.INVALID_JOB_ID, _unknown(job_id)
        if job is None or job.state != _DONE:  # a wait that may block
            if timeout_s != 0 and _callback_thread.__dict__.get("next") is not None:  # (the call only where due)
                hand_over_continuation()
            if job is None:  # a job in a lane, collected there
                ended = lanes.wait(job_id, timeout_s)
                if ended is not None:
                    return ended
                job = self._jobs.get(job_id)  # (taken from its lane meanwhile: the scheduler's now)
                if job is None:
                    return StatusCode.INVALID_JOB_ID, _unknown(job_id)
            if job.state != _DONE and not job.block(timeout_s):
                return StatusCode.JOB_PENDING, f"job {job_id} is still running"
        if job.callback is None:  # collected (a job with a callback goes once its callback has returned)
            self._jobs.pop(job_id, None)
        return job.status, job.error

    def wait_any(self, job_ids: Sequence[int], timeout_s: float | None) -> tuple[StatusCode, int, str]:
        """(status, job id, message) of whichever of the jobs ended first, collecting it."""
        table = self._jobs
        found = [table.get(job_id) for job_id in job_ids]
        lanes = self._lanes
        if lanes.known and None in found:
            if all(job is None for job in found):  # in the lane's own wait where one lane holds them all
                if timeout_s != 0 and _callback_thread.__dict__.get("next") is not None:
                    hand_over_continuation()
                ended = lanes.wait_any(job_ids, timeout_s)
                if ended is not None:
                    return ended
            with self._lock:  # jobs of several kinds (or lanes): the scheduler holds those in lanes
                found = [table.get(job_id) or self._take(job_id) for job_id in job_ids]
        if None in found:  # (Job has no __eq__: identity)
            job_id = job_ids[found.index(None)]
            return StatusCode.INVALID_JOB_ID, job_id, _unknown(job_id)
        if not found:
            return StatusCode.INVALID_JOB_ID, 0, "wait_any needs at least one job"
        jobs: list[Job] = found  # type: ignore[assignment]  # (no None in it)
        first = _first_ended(jobs)
        if first is None:
            if timeout_s != 0 and _callback_thread.__dict__.get("next") is not None:
                hand_over_continuation()
            for job in jobs:
                if job.launched is not None:
                    first = self._wait_any_launched(jobs, timeout_s)
                    break
            else:
                first = self._wait_any_ended(job_ids, jobs, timeout_s)
            if first is None:
                return JOB_PENDING, 0, f"none of jobs {list(job_ids)} has ended"
        if first.callback is None:
            table.pop(first.job_id, None)  # collected (a dict operation: atomic; walks over the table copy it)
        return first.status, first.job_id, first.error

    def _wait_any_ended(self, job_ids: Sequence[int], jobs: list[Job], timeout_s: float | None) -> Job | None:
        """wait_any over jobs that others end (workers, the engine's callbacks): one lock, released by the first of
        them to end."""
        wait = (set(job_ids), threading.Lock())
        wait[1].acquire()
        with self._lock:
            first = _first_ended(jobs)
            if first is not None:
                return first
            self._any_waits.append(wait)
        try:
            _block(wait[1], timeout_s)
        finally:
            with self._lock:
                self._any_waits.remove(wait)
                first = _first_ended(jobs)
        return first

    @staticmethod
    def _wait_any_launched(jobs: list[Job], timeout_s: float | None) -> Job | None:
        """wait_any where some jobs are ended by their waiter: where all are and the engine can wait for several
        at once (``Launched.wait_any``), that wait, in slices of ``_SLICE_S``; else the others looked at (polled),
        then a wait of ``ANY_SLICE_S`` on the oldest still running (on requests run in turn, the first to end: no
        poll of it first), until one has ended or the time is up."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            found = [j.launched for j in jobs if j.state != _DONE]
            if found and None not in found:  # (Launched has no __eq__: identity)
                # every job left is ended by its waiter: one wait in the engine for whichever ends, where it has one
                runs: list[Launched] = found  # type: ignore[assignment]  # (no None in it)
                left = None if deadline is None else deadline - time.monotonic()
                ended = runs[0].wait_any(runs[1:], _SLICE_S if left is None else max(0.0, min(_SLICE_S, left)))
                if ended is not None:
                    first = _first_ended(jobs)
                    if first is not None or left is not None and left <= _SLICE_S:
                        return first
                    continue
            oldest: Job | None = None
            for job in jobs:
                if job.launched is not None and job.state != _DONE and (oldest is None or job.job_id < oldest.job_id):
                    oldest = job
            others = [j for j in jobs if j is not oldest and j.state != _DONE]
            left = None if deadline is None else deadline - time.monotonic()
            launched = None if oldest is None else oldest.launched
            rest = [r for r in (j.launched for j in others) if r is not None]
            for r in rest:
                r.wait(0)
            first = _first_ended(jobs)
            if first is not None:
                return first
            slice_s = ANY_SLICE_S if left is None else max(0.0, min(ANY_SLICE_S, left))
            if launched is not None:
                launched.wait(slice_s)  # (0: a poll, where the time is up)
                first = _first_ended(jobs)
                if first is not None:
                    return first
            elif oldest is None and slice_s > 0:  # only jobs that end on their own are left (started elsewhere)
                time.sleep(slice_s)
            if left is not None and left <= slice_s:
                return None

    # -- state ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Jobs in the table (and in lanes): not yet collected by a wait, or with a callback not yet returned."""
        return len(self._jobs) + self._lanes.uncollected()

    @property
    def running(self) -> int:
        return self._running + self._lanes.running()

    def threads(self) -> list[threading.Thread]:
        return [*self._workers, *self.callbacks.threads]

    def close(self) -> None:
        """Refuse new jobs, end queued ones with FAILURE, let running ones end, deliver pending callbacks."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for job_id in self._lanes.jobs():  # jobs in lanes: the scheduler's own now, as every other job
                self._take(job_id)
            # close() in a callback on one of these workers: that worker runs nothing more until close returns, so
            # the job its callback submitted (its continuation) ends unrun, and it is no free worker
            here = _callback_thread.__dict__
            in_callback = here.get("scheduler") is self
            if in_callback and here.get("next") is not None:
                self._finish_locked(here["next"][0], StatusCode.FAILURE, "the runner was closed before the job ran")
                here["next"] = None
            # A worker runs one job at a time, in submission order: queued jobs that a free worker is about to
            # take run; the rest end here, never started.
            table = list(self._jobs.values())  # (a copy: jobs are collected without the lock)
            on_workers = sum(1 for j in table if j.state == _RUNNING and j.on_worker)
            free = len(self._workers) - on_workers - int(in_callback)
            queued = sorted((j for j in table if j.state == _QUEUED), key=lambda j: j.job_id)
            for job in queued[max(0, free):]:
                self._finish_locked(job, StatusCode.FAILURE, "the runner was closed before the job ran")
            running = [j for j in table if j.state != _DONE]
            workers = self._workers[:]
            self._workers.clear()  # (the finalizer's list: nothing left for it to end)
        for job in running:  # on a worker or on the engine: let them end
            job.block(None)
        with self._lock:
            self._lanes.close()
        me = threading.current_thread()
        for _ in workers:
            self._queue.put(None)
        for worker in workers:
            if worker is not me:
                worker.join()
        self.callbacks.close()
        # callbacks run inline by workers have returned with them (all but this thread's own, where close() is
        # called from one)


def _work(get: Callable[[], tuple[Job, Work, tuple[Any, ...]] | None], lock: threading.Lock) -> None:
    """A worker: run queued jobs until the sentinel (its continuations first); a worker never dies of a job. It
    holds its scheduler only through the job it runs (a job holds its scheduler until it ends)."""
    here = _callback_thread.__dict__
    while True:
        item = here.get("next")
        if item is None:
            # an idle worker must not keep its last job (the app's tensors, the plan, the engine) alive
            job = work = args = scheduler = None
            item = get()
            if item is None:
                return
        else:
            here["next"] = None
        job, work, args = item
        lock.acquire()
        try:
            if job.state == _DONE:  # ended by close() before it started
                continue
            job.state = _RUNNING
            job.on_worker = True
            scheduler = job.scheduler
        finally:
            lock.release()
        if scheduler is None:  # (cannot be: a job holds its scheduler until it ends)
            continue
        try:
            status, message = work(*args)
        except BaseException as e:  # noqa: BLE001
            status, message = StatusCode.FAILURE, f"unexpected error: {e!r}"
        scheduler.finish(job, status, message, on_worker=True)


def hand_over_continuation() -> None:
    """On a worker inside a job's callback: give the job that callback submitted (the worker's next job) to the
    other workers, so that a wait that follows cannot wait for it in vain. Any npurt wait that may block inside a
    callback calls this first; elsewhere it does nothing."""
    here = _callback_thread.__dict__
    item = here.get("next")
    if item is None:
        return
    here["next"] = None
    scheduler: JobScheduler = here["scheduler"]
    scheduler._hand_over(*item)
