"""A served model: one runner of ``npurt serve``, shared by every client that opened the model with the same options.

- ``ServedModel`` is one runner per (model name, options that change what is compiled), created on first use by the
  ``Service`` and shared by every client that opens the model with those options. ``slots`` jobs run at once, on
  the thread of the client that sent one when a slot is free, else on the served model's workers.
- Its jobs wait in a ``FairQueue`` (round robin over clients: one job of each client with work in turn, so a client
  with many jobs in flight cannot starve one with few) and run with ``Runner.execute``; the run's end answers them.
- A ``Binding`` is a client's registered tensors as the runner takes them; a ``Job`` is one run of one client.
- A job answers through its ``JobOwner`` (a client of the socket protocol: ``npurt.serve.session.Session``; a request
  of the Open Inference Protocol): the served model runs jobs and answers them, the owner sends the answers. Nothing
  here knows who the owner is.

Why workers with ``execute`` rather than ``execute_async`` and its callback: measured on this machine, a job's trip
through the runner's job table and callback thread costs 30-60 us more than ``execute`` (PP-OCR classifier), and the
workers give the queue its order. The runner underneath is the same contract; nothing of it is copied here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..runner import Runner
from ..streams import Stream
from ..tensor import NpuTensor
from ..types import NpuError, StatusCode
from . import protocol as p

log = logging.getLogger("npurt.serve")


# ---------------------------------------------------------------------------------------------- who jobs answer
class JobOwner(Protocol):
    """Who a job answers to. ``sid``: the client it counts against in the fair queue; ``closed``: nobody waits for
    the answer any more (its job is skipped). Every accepted job ends with exactly one ``job_ended``, after its
    answer (if any)."""

    sid: int
    closed: bool

    def reply_done(self, req: int, status: StatusCode, message: str, shapes: list[Any] | None) -> None:
        """A run of registered tensors ended: its status, the error, the output shapes a run decided (or None)."""

    def reply_outputs(self, req: int, outputs: dict[str, np.ndarray]) -> None:
        """A run of arrays ended well: its output arrays."""

    def reply_error(self, req: int, status: StatusCode, message: str) -> None:
        """A run of arrays failed."""

    def job_ended(self) -> None:
        """The job is over (answered, skipped or dropped unrun)."""


class JobObserver(Protocol):
    """Told of every job a served model ran (its metrics): how long it waited for a slot, how long it ran."""

    def job_ran(self, model: str, queued_s: float, compute_s: float, ok: bool) -> None:
        """One job ran: seconds queued, seconds running, whether it succeeded."""


# ---------------------------------------------------------------------------------------------- the queue
class FairQueue:
    """Jobs of several clients, taken in round robin: one job of each client that has any, in turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ring: OrderedDict[int, deque[Job]] = OrderedDict()  # client -> its jobs, the next client first
        self._closed = False
        self.size = 0  # jobs queued (read without the lock by the slots' hot paths: a C read, no __len__ frame)

    def put(self, client: int, job: Job) -> bool:
        with self._lock:
            if self._closed:
                return False
            jobs = self._ring.get(client)
            if jobs is None:
                self._ring[client] = deque((job,))
            else:
                jobs.append(job)
            self.size += 1
            return True

    def get(self) -> Job | None:
        """The next job, None where there is none."""
        with self._lock:
            if not self._ring:
                return None
            client, jobs = next(iter(self._ring.items()))
            job = jobs.popleft()
            if jobs:
                self._ring.move_to_end(client)  # the others' turn first
            else:
                del self._ring[client]
            self.size -= 1
            return job

    def drop(self, client: int | None = None) -> list[Job]:
        """Take out one client's queued jobs (None: everyone's)."""
        with self._lock:
            if client is None:
                dropped = [j for jobs in self._ring.values() for j in jobs]
                self._ring.clear()
            else:
                dropped = list(self._ring.pop(client, ()))
            self.size -= len(dropped)
            return dropped

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def __len__(self) -> int:
        return self.size


# ---------------------------------------------------------------------------------------------- served models
class Binding:
    """A client's registered tensors (mapped here), as the runner takes them: one batch slot."""

    __slots__ = ("served", "runner_id", "inputs", "outputs", "nbytes")

    def __init__(self, served: ServedModel, runner_id: int, inputs: list[NpuTensor], outputs: list[NpuTensor],
                 nbytes: int) -> None:
        self.served, self.runner_id = served, runner_id
        self.inputs, self.outputs = [inputs], [outputs]
        self.nbytes = nbytes


class Job:
    """One run: of registered tensors (``binding``), or of arrays (``arrays``: ``Runner.run``'s feeds)."""

    __slots__ = ("owner", "req", "binding", "stream", "arrays", "queued_at", "started_at", "ended_at")

    def __init__(self, owner: JobOwner, req: int, binding: Binding | None, stream: Stream | None,
                 arrays: dict[str, np.ndarray] | None = None) -> None:
        self.owner, self.req, self.binding, self.stream, self.arrays = owner, req, binding, stream, arrays
        self.queued_at = time.monotonic()
        self.started_at = self.ended_at = 0.0  # its run's start and end (0: not run)


class ServedModel:
    """One runner shared by every client that opened the model with these options, and its workers.

    ``slots`` runs at once. A run that finds a slot free and nobody queued runs at once on the thread of the client
    that sent it; the others wait in the fair queue. A thread that ends a run takes the next queued job itself,
    keeping the slot (no thread handoff: each costs tens of microseconds when the CPU it wakes was idle); the
    workers take queued jobs when slots are free and no running thread will."""

    def __init__(self, name: str, key: str, options: dict[str, Any], runner: Runner, slots: int,
                 observer: JobObserver | None = None) -> None:
        self.name, self.key, self.options, self.runner = name, key, options, runner
        self.observer = observer
        self.queue = FairQueue()
        self.slots = slots
        # slots in use, and workers waiting for a job; the hot paths take the condition's lock itself (a Condition's
        # ``with`` is two Python calls around it, paid twice by every job)
        self._slots_lock = threading.Lock()
        self._cond = threading.Condition(self._slots_lock)
        self._busy = 0
        self._closed = False
        self.stateful = bool(runner.engine_for().state_names) if _has_default(runner) else False
        self.jobs_run = 0
        self.description = self._describe()
        self._workers = [threading.Thread(target=self._work, name=f"npurt-serve-{name}-{k}", daemon=True)
                         for k in range(slots)]
        for w in self._workers:
            w.start()

    def try_slot(self) -> bool:
        """A slot for a run on the caller's thread: only when one is free and nobody waits in the queue."""
        with self._slots_lock:
            if self._busy < self.slots and not self.queue.size:
                self._busy += 1
                return True
            return False

    def submit(self, client: int, job: Job) -> bool:
        """Queue a job (False once closed); a worker takes it if a slot is free."""
        if not self.queue.put(client, job):
            return False
        with self._cond:
            if self._busy < self.slots:
                self._cond.notify()
        return True

    def run_inline(self, job: Job | None, before_queued: Callable[[], None] | None = None) -> None:
        """Run a job in the slot ``try_slot`` gave (and the queued jobs after it while there are any, calling
        ``before_queued()`` before each of those)."""
        queue = self.queue
        while job is not None:
            self.run(job)
            with self._slots_lock:  # (submit counts its job in the queue before it takes this lock to wake a worker)
                job = queue.get() if queue.size else None
                if job is None:
                    self._busy -= 1
            if job is not None and before_queued is not None:
                try:
                    before_queued()
                except Exception:  # noqa: BLE001 - the queued job runs whatever happened
                    log.exception("model %s: preparing to run a queued job failed", self.name)

    def run_once(self, job: Job) -> None:
        """Run a job in the slot ``try_slot`` gave, then give the slot back (a worker takes the jobs queued
        meanwhile): for a caller that answers only once this returns (an Open Inference Protocol request), which
        must not run other requests' jobs before its answer goes."""
        try:
            self.run(job)
        finally:
            self.release_slot()

    def release_slot(self) -> None:
        """Give back a slot ``try_slot`` gave, unused."""
        with self._cond:
            self._busy -= 1
            self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    job = self.queue.get() if self._busy < self.slots else None
                    if job is not None:
                        self._busy += 1
                        break
                    self._cond.wait()
            self.run_inline(job)
            del job  # an idle worker must not keep its last job's tensors (a gone client's memory) alive

    def _describe(self) -> dict[str, Any]:
        r = self.runner
        info = r.device_info
        return {"model": self.name, "backend": r.runner_type, "target": r.backend.target,
                "device_info": p.device_info_to_dict(info), "dynamic_shapes": info.shape_mode == "dynamic",
                "inputs": [p.spec_to_dict(s) for s in r.input_specs],
                "outputs": [p.spec_to_dict(s) for s in r.output_specs], "options": self.options,
                "max_concurrent_runs": r.max_concurrent_runs, "engine_settings": dict(info.engine_settings),
                "stateful": self.stateful}

    @property
    def queued(self) -> int:
        return len(self.queue)

    def drop_jobs(self, client: int | None = None, reason: str = "") -> int:
        """Take one client's queued jobs out (None: everyone's) and end them unrun; with a ``reason``, each is
        answered with FAILURE saying so (without, its client is gone). The number dropped."""
        dropped = self.queue.drop(client)
        for job in dropped:
            if reason:
                if job.arrays is not None:
                    job.owner.reply_error(job.req, StatusCode.FAILURE, reason)
                else:
                    job.owner.reply_done(job.req, StatusCode.FAILURE, reason, None)
            job.owner.job_ended()
        return len(dropped)

    def run(self, job: Job) -> None:
        """Run one job and answer it (a worker, or a client's thread, never dies of a job)."""
        started = job.started_at = time.monotonic()
        ok = False
        try:
            ok = self._run(job)
        except Exception:  # noqa: BLE001
            log.exception("model %s: a job of client %d failed unexpectedly", self.name, job.owner.sid)
            if job.arrays is not None:
                job.owner.reply_error(job.req, StatusCode.FAILURE, "the service failed to run the job")
            else:
                job.owner.reply_done(job.req, StatusCode.FAILURE, "the service failed to run the job", None)
        finally:
            job.ended_at = time.monotonic()
            if self.observer is not None:
                self.observer.job_ran(self.name, started - job.queued_at, job.ended_at - started, ok)
            job.owner.job_ended()

    def _run(self, job: Job) -> bool:
        """Run a job and answer it; whether it succeeded."""
        owner = job.owner
        if owner.closed:
            return False  # its client is gone: nobody waits for the answer
        self.jobs_run += 1
        if job.arrays is not None:
            try:
                outputs = self.runner.run(job.arrays, job.stream)
            except (ValueError, NpuError) as e:
                owner.reply_error(job.req, *status_of_exception(e))
                return False
            owner.reply_outputs(job.req, outputs)
            return True
        binding = job.binding
        assert binding is not None
        runner = self.runner
        status = runner.execute(binding.inputs, binding.outputs, job.stream)
        shapes: list[list[int] | None] | None = None  # only where a run decided an output's shape
        for k, t in enumerate(binding.outputs[0]):
            result = t.result_info
            if result is not t.info:
                if shapes is None:
                    shapes = [None] * len(binding.outputs[0])
                shapes[k] = list(result.shape)
        owner.reply_done(job.req, status, runner.last_error if status is not StatusCode.SUCCESS else "", shapes)
        return status is StatusCode.SUCCESS

    def ports_for(self, signature: list[tuple[int, ...]] | None) -> dict[str, Any]:
        """The ports (and variables) of the engine that runs these input shapes (None: the dynamic one),
        compiling it if needed."""
        engine = self.runner.engine_for(signature, compile=True)
        return {"inputs": [p.port_to_dict(x) for x in engine.inputs],
                "outputs": [p.port_to_dict(x) for x in engine.outputs],
                "state_names": list(engine.state_names)}

    def close(self) -> None:
        self.queue.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for w in self._workers:
            w.join()
        self.runner.close()


def status_of_exception(e: Exception) -> tuple[StatusCode, str]:
    """Runner.run's exception as a status: its NpuError text starts with the status name."""
    if isinstance(e, ValueError):
        return StatusCode.INVALID_INPUT, str(e)
    name, sep, rest = str(e).partition(": ")
    if sep and name in StatusCode.__members__:
        return StatusCode[name], rest
    return StatusCode.RUNTIME_ERROR, str(e)


def _has_default(runner: Runner) -> bool:
    try:
        runner.engine_for()
        return True
    except ValueError:
        return False


__all__ = ["Binding", "FairQueue", "Job", "JobObserver", "JobOwner", "ServedModel", "status_of_exception"]
