"""``npurt serve``: one process owns the runners (the device, the compiled models); clients run them through it.

- ``Service`` listens on an AF_UNIX SOCK_SEQPACKET socket (mode 0600, or 0660 for a group), identifies each peer by
  SO_PEERCRED, refuses uids it does not allow and connections over the limits, and gives every accepted connection a
  ``Session`` on a thread of its own.
- A ``ServedModel`` is one runner per (model name, options that change what is compiled), created on first use and
  shared by every client that opens the model with those options. Its jobs wait in a ``FairQueue`` (round robin over
  clients: one job of each client with work in turn, so a client with many jobs in flight cannot starve one with
  few) and run on the served model's workers with ``Runner.execute``, which reply when the run ends.
- A ``Session`` is one client: the runners it opened, the tensors it registered (imported with ``npurt.share``'s
  validated fd import: dma-bufs and memfds sealed against shrinking only), its stream contexts and jobs. Ids are per
  session, so a client names only its own; when the client goes (closed, killed), everything it held is freed once
  its jobs in flight end.

Why workers with ``execute`` rather than ``execute_async`` and its callback: measured on this machine, a job's trip
through the runner's job table and callback thread costs 30-60 us more than ``execute`` (PP-OCR classifier), and the
workers give the queue its order. The runner underneath is the same contract; nothing of it is copied here.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import selectors
import socket
import stat
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..factory import RunnerFactory, create_auto
from ..runner import Runner
from ..streams import Stream
from ..tensor import NpuTensor, allocate_tensor
from ..types import DataType, MemoryType, NpuError, NpuTensorInfo, StatusCode, TensorDirection, TensorType
from . import protocol as p

log = logging.getLogger("npurt.serve")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_NO_SHAPES: list[None] = []
SHUTDOWN_GRACE_S = 0.25  # after telling clients of a shutdown, runs still come in for this long (sent before)


@dataclass
class Limits:
    """What one service gives: to all clients together, and to each one."""

    max_clients: int = 64  # connections at once
    max_connections_per_uid: int = 16
    max_jobs_per_client: int = 64  # runs queued or running, per connection
    max_mapped_bytes_per_client: int = 1 << 30  # tensor memory a connection has registered
    max_bindings_per_client: int = 1024  # registered tensor sets (each holds its tensors' fds)
    max_contexts_per_client: int = 256  # stream contexts of stateful models
    max_runners: int = 16  # served runners (model x options), for all clients
    handshake_timeout_s: float = 5.0  # to say HELLO
    send_timeout_s: float = 5.0  # a client's answers may wait unread this long (its queue full), then it goes
    drain_timeout_s: float = 30.0  # on shutdown, for the jobs already accepted
    allowed_uids: frozenset[int] | None = None  # None: whoever the socket's permissions let in


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command}) uid {self.uid}"


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    try:
        with open(f"/proc/{pid}/comm") as f:
            command = f.read().strip()
    except OSError:
        command = "?"
    return Peer(pid, uid, gid, command)


class ServiceError(Exception):
    """A request the service answers with a status and a message (never a crash)."""

    def __init__(self, status: StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------- the queue
class FairQueue:
    """Jobs of several clients, taken in round robin: one job of each client that has any, in turn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ring: OrderedDict[int, deque[Job]] = OrderedDict()  # client -> its jobs, the next client first
        self._closed = False
        self._size = 0

    def put(self, client: int, job: Job) -> bool:
        with self._lock:
            if self._closed:
                return False
            jobs = self._ring.get(client)
            if jobs is None:
                self._ring[client] = deque((job,))
            else:
                jobs.append(job)
            self._size += 1
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
            self._size -= 1
            return job

    def drop(self, client: int | None = None) -> list[Job]:
        """Take out one client's queued jobs (None: everyone's)."""
        with self._lock:
            if client is None:
                dropped = [j for jobs in self._ring.values() for j in jobs]
                self._ring.clear()
            else:
                dropped = list(self._ring.pop(client, ()))
            self._size -= len(dropped)
            return dropped

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def __len__(self) -> int:
        return self._size


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
    __slots__ = ("session", "req", "binding", "stream", "arrays", "queued_at")

    def __init__(self, session: Session, req: int, binding: Binding | None, stream: Stream | None,
                 arrays: list[NpuTensor] | None = None) -> None:
        self.session, self.req, self.binding, self.stream, self.arrays = session, req, binding, stream, arrays
        self.queued_at = time.monotonic()


class ServedModel:
    """One runner shared by every client that opened the model with these options, and its workers.

    ``slots`` runs at once. A run that finds a slot free and nobody queued runs at once on the thread of the client
    that sent it; the others wait in the fair queue. A thread that ends a run takes the next queued job itself,
    keeping the slot (no thread handoff: each costs tens of microseconds when the CPU it wakes was idle); the
    workers take queued jobs when slots are free and no running thread will."""

    def __init__(self, name: str, key: str, options: dict[str, Any], runner: Runner, slots: int) -> None:
        self.name, self.key, self.options, self.runner = name, key, options, runner
        self.queue = FairQueue()
        self.slots = slots
        self._cond = threading.Condition(threading.Lock())  # slots in use, and workers waiting for a job
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
        with self._cond:
            if self._busy < self.slots and not len(self.queue):
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

    def run_inline(self, job: Job) -> None:
        """Run a job in the slot ``try_slot`` gave (and the queued jobs after it while there are any)."""
        self._run_in_slot(job)

    def release_slot(self) -> None:
        """Give back a slot ``try_slot`` gave, unused."""
        with self._cond:
            self._busy -= 1
            self._cond.notify()

    def _run_in_slot(self, job: Job | None) -> None:
        while job is not None:
            self.run(job)
            with self._cond:
                job = self.queue.get()
                if job is None:
                    self._busy -= 1

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
            self._run_in_slot(job)
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

    def run(self, job: Job) -> None:
        """Run one job and answer it (a worker, or a client's thread, never dies of a job)."""
        try:
            self._run(job)
        except Exception:  # noqa: BLE001
            log.exception("model %s: a job of client %d failed unexpectedly", self.name, job.session.sid)
            job.session.reply_done(job.req, StatusCode.FAILURE, "the service failed to run the job", None)
        finally:
            job.session.job_ended()

    def _run(self, job: Job) -> None:
        session = job.session
        if session.closed:
            return  # its client is gone: nobody waits for the answer
        self.jobs_run += 1
        if job.arrays is not None:
            session.reply_arrays(job.req, self.runner, job.arrays, job.stream)
            return
        binding = job.binding
        assert binding is not None
        runner = self.runner
        status = runner.execute(binding.inputs, binding.outputs, job.stream)
        shapes: list[list[int] | None] = _NO_SHAPES  # type: ignore[assignment]  # shared empty list, never written
        for k, t in enumerate(binding.outputs[0]):
            result = t.result_info
            if result is not t.info:
                if not shapes:
                    shapes = [None] * len(binding.outputs[0])
                shapes[k] = list(result.shape)
        session.reply_done(job.req, status, runner.last_error if status is not StatusCode.SUCCESS else "", shapes)

    def ports_for(self, signature: list[tuple[int, ...]] | None) -> dict[str, Any]:
        """The ports (and variables) of the engine that runs these input shapes (None: the dynamic one),
        compiling it if needed."""
        # The Runner offers no public "compile the engine for these shapes and give its ports" (engine_for only
        # finds compiled ones), so this reaches into its shape variants, the only place this package does.
        variants = self.runner._variants
        assert variants is not None
        variant = variants._dynamic_variant() if signature is None else variants.get(tuple(signature))
        return {"inputs": [p.port_to_dict(x) for x in variant.inputs],
                "outputs": [p.port_to_dict(x) for x in variant.outputs],
                "state_names": list(variant.engine.state_names)}

    def close(self) -> None:
        self.queue.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for w in self._workers:
            w.join()
        self.runner.close()


def _has_default(runner: Runner) -> bool:
    try:
        runner.engine_for()
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------- sessions
class Session:
    """One client connection: its runners, registered tensors, contexts and jobs, and the threads that serve it.

    Its threads all wait in ``recvmsg`` on the connection; the kernel hands each message to one of them. A thread
    that runs a job at once leaves the others to read the client's next messages (one more is started where none
    would be left), and reads again after it. The first thread to see the connection end frees the client's
    state."""

    def __init__(self, service: Service, sock: socket.socket, sid: int, peer: Peer) -> None:
        self.service, self.sock, self.sid, self.peer = service, sock, sid, peer
        self.limits = service.limits
        self.closed = False
        self.draining = False
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # ids, counters
        self.runners: dict[int, ServedModel] = {}
        self.bindings: dict[int, Binding] = {}
        self.contexts: dict[int, tuple[int, ServedModel, Stream]] = {}  # id -> (runner id, served, stream)
        self._next_id = 1
        self.in_flight = 0
        self.mapped = 0
        self.jobs = 0
        self.failed = 0
        self._idle = threading.Condition(self._lock)
        self._readers = 0  # threads reading (or about to), not running a job
        self._ended = False  # the connection has ended
        self.threads: list[threading.Thread] = []
        self.greeted = False

    def start(self) -> None:
        self._spawn(self._first)

    def _spawn(self, target: Callable[[], None]) -> None:
        with self._lock:
            self._readers += 1
        thread = threading.Thread(target=target, name=f"npurt-serve-client-{self.sid}-{len(self.threads)}",
                                  daemon=True)
        self.threads.append(thread)
        thread.start()

    # -- sending ----------------------------------------------------------------------------------------
    def send(self, message: bytes, ancdata: list[Any] | None = None) -> None:
        """One message (with the fds of its tensors); a gone peer is not an error. A client that leaves its answers
        unread for ``send_timeout_s`` (its socket's queue full) is disconnected: the thread sending may hold a slot
        that other clients' jobs wait for."""
        try:
            with self._send_lock:
                self._send_locked(message, ancdata)
        except TimeoutError:
            log.warning("client %d (%s) leaves its answers unread for %.1f s; disconnecting it", self.sid, self.peer,
                        self.limits.send_timeout_s)
            self.disconnect()
        except OSError as e:
            if not self.closed:
                log.debug("client %d: cannot send: %s", self.sid, e)

    def _send_locked(self, message: bytes, ancdata: list[Any] | None) -> None:
        deadline = 0.0
        while True:
            try:
                if ancdata:
                    self.sock.sendmsg([message], ancdata, socket.MSG_DONTWAIT)
                else:
                    self.sock.send(message, socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                now = time.monotonic()
                deadline = deadline or now + self.limits.send_timeout_s
                if now >= deadline:
                    raise TimeoutError from None
                select.select([], [self.sock], [], deadline - now)

    def disconnect(self) -> None:
        """End the connection (its threads see the end and free the client's state)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def reply_tensors(self, req: int, tensors: list[NpuTensor]) -> None:
        self.send(*p.pack_tensors(p.REPLY, req, tensors))

    def reply(self, req: int, doc: Mapping[str, Any] | None = None, a: int = 0, b: int = 0) -> None:
        self.send(p.pack_json(p.REPLY, req, doc or {}, a, b))

    def reply_error(self, req: int, status: StatusCode, message: str) -> None:
        self.send(p.pack_json(p.REPLY, req, {"error": message[:8000]}, status=int(status)))

    def reply_done(self, req: int, status: StatusCode, message: str, shapes: list[Any] | None) -> None:
        if status is StatusCode.SUCCESS and not shapes:
            self.send(p.HEAD.pack(p.DONE, 0, 0, 0, 0, req))
            return
        doc: dict[str, Any] = {}
        if message:
            doc["error"] = message[:8000]
        if shapes:
            doc["shapes"] = shapes
        self.send(p.pack_json(p.DONE, req, doc, status=int(status)))

    def reply_arrays(self, req: int, runner: Runner, inputs: list[NpuTensor], stream: Stream | None) -> None:
        """Runner.run on the client's input tensors; the outputs go back in memory of their own (new memfds)."""
        try:
            results = runner.run({t.info.name: t.numpy() for t in inputs}, stream)
        except (ValueError, NpuError) as e:
            status, message = _status_of_message(e)
            self.reply_error(req, status, message)
            return
        self.reply_tensors(req, [_tensor_of(name, array, TensorDirection.OUTPUT) for name, array in results.items()])

    # -- jobs -----------------------------------------------------------------------------------------------
    def job_ended(self) -> None:
        with self._lock:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.notify_all()

    def _count_job(self) -> None:
        """Count a job in flight (ServiceError when shutting down or over this client's limit)."""
        if self.draining:
            raise ServiceError(StatusCode.FAILURE, "the service is shutting down: it takes no new jobs")
        with self._lock:
            if self.in_flight >= self.limits.max_jobs_per_client:
                raise ServiceError(StatusCode.RESOURCE_UNAVAILABLE,
                                   f"this client has {self.in_flight} jobs queued or running, the service's limit "
                                   f"per client (--max-jobs-per-client {self.limits.max_jobs_per_client}); wait for "
                                   "one and retry")
            self.in_flight += 1
            self.jobs += 1

    def _accept_job(self, served: ServedModel, job: Job) -> None:
        self._count_job()
        if not served.submit(self.sid, job):
            self.job_ended()
            raise ServiceError(StatusCode.FAILURE, "the service is shutting down: it takes no new jobs")

    def wait_idle(self, deadline: float) -> bool:
        with self._lock:
            while self.in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    # -- the reader -------------------------------------------------------------------------------------
    def _first(self) -> None:
        """The first thread: the handshake, then a reader like the others."""
        try:
            ok = self._handshake()
        except Exception:  # noqa: BLE001
            log.exception("client %d: unexpected error in the handshake", self.sid)
            ok = False
        if ok:
            self._serve()
        else:
            self._end()

    def _serve(self) -> None:
        try:
            self._read()
        except Exception:  # noqa: BLE001 - one client's trouble never takes the service down
            log.exception("client %d: unexpected error; closing its connection", self.sid)
            self.disconnect()  # the other threads see the end too
        with self._lock:
            self._readers -= 1
            first = not self._ended
            self._ended = True
        if first:
            self._end()

    def _handshake(self) -> bool:
        self.sock.settimeout(self.limits.handshake_timeout_s)
        try:
            data = self.sock.recv(p.MAX_MESSAGE + 1)
        except (TimeoutError, OSError) as e:
            log.info("client %d (%s): no HELLO (%s); closed", self.sid, self.peer, e)
            return False
        try:
            kind, _, _, _, _, req = p.unpack(data)
            doc = p.body_json(data)
            if kind != p.HELLO or doc.get("magic") != p.MAGIC:
                raise p.ProtocolError("the first message is not an npurt serve HELLO")
            if doc.get("version") != p.VERSION:
                raise p.ProtocolError(f"protocol version {doc.get('version')!r}; this service speaks {p.VERSION}")
        except p.ProtocolError as e:
            log.info("client %d (%s): refused: %s", self.sid, self.peer, e)
            self.send(p.pack_json(p.NOTICE, 0, {"refused": str(e)}))
            return False
        self.sock.settimeout(None)
        limits = self.limits
        self.reply(req, {"version": p.VERSION, "pid": os.getpid(), "client": self.sid,
                         "limits": {"max_jobs_per_client": limits.max_jobs_per_client,
                                    "max_mapped_bytes_per_client": limits.max_mapped_bytes_per_client,
                                    "max_bindings_per_client": limits.max_bindings_per_client}})
        log.info("client %d connected: %s", self.sid, self.peer)
        self.greeted = True
        return True

    def _read(self) -> None:
        """Read and handle messages until the connection ends."""
        buffer = bytearray(p.MAX_MESSAGE + 1)
        view = memoryview(buffer)
        handlers = self._handlers()
        recvmsg_into = self.sock.recvmsg_into
        while True:
            try:
                n, ancdata, msg_flags, _ = recvmsg_into([buffer], p.ANCILLARY_SIZE, socket.MSG_CMSG_CLOEXEC)
            except OSError:
                return
            if n == 0:
                return
            message = Message(view[:n], ancdata, msg_flags)
            try:
                if n < p.HEAD.size or n > p.MAX_MESSAGE:
                    log.warning("client %d: a message of %d bytes; ignored", self.sid, n)
                    continue
                kind, _, message.flags, a, b, req = p.HEAD.unpack_from(buffer)
                if kind == p.RUN:  # the hot path first
                    self._run(req, a, b)
                    continue
                handler = handlers.get(kind)
                if handler is None:
                    self.reply_error(req, StatusCode.INVALID_INPUT, f"unknown message kind {kind}")
                    continue
                try:
                    handler(req, a, b, message)
                except ServiceError as e:
                    self.reply_error(req, e.status, str(e))
                except (p.ProtocolError, ValueError) as e:
                    self.reply_error(req, StatusCode.INVALID_INPUT, str(e))
                except (NpuError, OSError) as e:
                    self.reply_error(req, StatusCode.RUNTIME_ERROR, f"{type(e).__name__}: {e}")
            finally:
                if ancdata and not message.consumed:
                    p.close_fds(ancdata)  # fds on a message that takes none: closed, never kept

    def _handlers(self) -> dict[int, Callable[[int, int, int, Message], None]]:
        return {p.MODELS: self._models, p.DESCRIBE: self._describe, p.OPEN: self._open, p.COMPILE: self._compile,
                p.BIND: self._bind, p.UNBIND: self._unbind, p.RUN_ARRAYS: self._run_arrays,
                p.CLOSE_RUNNER: self._close_runner, p.CONTEXT_OPEN: self._context_open,
                p.CONTEXT_CLOSE: self._context_close, p.STATE_GET: self._state_get, p.STATE_SET: self._state_set,
                p.STATE_RESET: self._state_reset, p.STATS: self._stats, p.HELLO: self._hello_again}

    def _new_id(self) -> int:
        with self._lock:
            i = self._next_id
            self._next_id += 1
            return i

    def _runner(self, runner_id: int) -> ServedModel:
        served = self.runners.get(runner_id)
        if served is None:
            raise ServiceError(StatusCode.INVALID_INPUT, f"runner {runner_id} is not open on this connection")
        return served

    # -- requests -----------------------------------------------------------------------------------------
    def _hello_again(self, req: int, a: int, b: int, msg: Message) -> None:
        raise p.ProtocolError("HELLO was said already")

    def _models(self, req: int, a: int, b: int, msg: Message) -> None:
        self.reply(req, {"models": self.service.models_summary()})

    def _describe(self, req: int, a: int, b: int, msg: Message) -> None:
        doc = msg.doc()
        name = p.field(doc, "model", str, "DESCRIBE")
        defaults = self.service.model_defaults(name)
        options, _ = p.merge_served(defaults, p.field(doc, "options", dict, "DESCRIBE"))
        self.reply(req, {"options": p.served_options(options, {**defaults, **doc["options"]})})

    def _open(self, req: int, a: int, b: int, msg: Message) -> None:
        doc = msg.doc()
        name = p.field(doc, "model", str, "OPEN")
        served = self.service.served(name, p.field(doc, "options", dict, "OPEN"))
        runner_id = self._new_id()
        self.runners[runner_id] = served
        log.info("client %d opened %s: %s on %s", self.sid, name, served.runner.runner_type,
                 served.runner.device_info.attached)
        self.reply(req, served.description, a=runner_id)

    def _compile(self, req: int, a: int, b: int, msg: Message) -> None:
        served = self._runner(a)
        doc = msg.doc()
        signature = doc.get("signature")
        if signature is not None:
            if not isinstance(signature, list) or len(signature) > 1024:
                raise p.ProtocolError("COMPILE: signature is not a list of shapes")
            signature = [tuple(p._ints(s, "COMPILE signature")) for s in signature]
        try:
            self.reply(req, served.ports_for(signature))
        except ValueError as e:
            raise ServiceError(StatusCode.INVALID_INPUT, str(e)) from None

    def _bind(self, req: int, a: int, b: int, msg: Message) -> None:
        tensors = msg.tensors("BIND")  # mapped now; dropped again if refused
        served = self._runner(a)
        if not 0 <= b <= len(tensors):
            raise p.ProtocolError(f"BIND: {b} inputs of {len(tensors)} tensors")
        limits = self.limits
        nbytes = sum(t.nbytes for t in tensors)
        with self._lock:
            if len(self.bindings) >= limits.max_bindings_per_client:
                raise ServiceError(StatusCode.RESOURCE_UNAVAILABLE,
                                   f"this client has {len(self.bindings)} tensor sets registered, the service's "
                                   f"limit per client (--max-bindings-per-client {limits.max_bindings_per_client})")
            if self.mapped + nbytes > limits.max_mapped_bytes_per_client:
                raise ServiceError(StatusCode.OUT_OF_MEMORY,
                                   f"registering {nbytes} bytes would give this client {self.mapped + nbytes} bytes "
                                   f"of tensor memory mapped in the service, over its limit of "
                                   f"{limits.max_mapped_bytes_per_client} (--max-mapped-mb-per-client)")
            self.mapped += nbytes
            binding_id = self._next_id
            self._next_id += 1
            self.bindings[binding_id] = Binding(served, a, tensors[:b], tensors[b:], nbytes)
        self.reply(req, a=binding_id)

    def _unbind(self, req: int, a: int, b: int, msg: Message) -> None:
        with self._lock:
            binding = self.bindings.pop(a, None)
            if binding is not None:
                self.mapped -= binding.nbytes  # unmapped when the last job that uses it ends

    def _stream(self, context_id: int, served: ServedModel) -> Stream | None:
        if not context_id:
            if served.stateful:
                raise ServiceError(StatusCode.INVALID_INPUT, "this model keeps state between runs: a run needs a "
                                                             "context of its own (CONTEXT_OPEN)")
            return None
        entry = self.contexts.get(context_id)
        if entry is None or entry[1] is not served:
            raise ServiceError(StatusCode.INVALID_INPUT, f"context {context_id} is not open for this runner on this "
                                                         "connection")
        return entry[2]

    def _run(self, req: int, binding_id: int, context_id: int) -> None:
        """RUN: run the job on this thread when the model has a free slot and nobody queues, else queue it."""
        binding = self.bindings.get(binding_id)
        try:
            if binding is None:
                raise ServiceError(StatusCode.INVALID_INPUT, f"tensor set {binding_id} is not registered on this "
                                                             "connection")
            served = binding.served
            job = Job(self, req, binding, self._stream(context_id, served))
            if not served.try_slot():
                self._accept_job(served, job)
                return
            try:
                self._count_job()
            except ServiceError:
                served.release_slot()
                raise
            with self._lock:
                self._readers -= 1
                alone = self._readers == 0
            if alone:
                self._spawn(self._serve)  # someone must read the client's next messages meanwhile
            try:
                served.run_inline(job)
            finally:
                with self._lock:
                    self._readers += 1
        except ServiceError as e:
            self.reply_done(req, e.status, str(e), None)

    def _run_arrays(self, req: int, a: int, b: int, msg: Message) -> None:
        tensors = msg.tensors("RUN_ARRAYS")
        served = self._runner(a)
        self._accept_job(served, Job(self, req, None, self._stream(b, served), tensors))

    def _close_runner(self, req: int, a: int, b: int, msg: Message) -> None:
        served = self.runners.pop(a, None)
        if served is not None:
            self._drop_runner_state(a)
        self.reply(req)

    def _drop_runner_state(self, runner_id: int) -> None:
        with self._lock:
            gone = [k for k, v in self.bindings.items() if v.runner_id == runner_id]
            for k in gone:
                self.mapped -= self.bindings.pop(k).nbytes
            contexts = [(k, v) for k, v in self.contexts.items() if v[0] == runner_id]
            for k, _ in contexts:
                del self.contexts[k]
        for _, (_, served, stream) in contexts:
            served.runner.close_stream(stream)

    def _context_open(self, req: int, a: int, b: int, msg: Message) -> None:
        served = self._runner(a)
        if len(self.contexts) >= self.limits.max_contexts_per_client:
            raise ServiceError(StatusCode.RESOURCE_UNAVAILABLE,
                               f"this client has {len(self.contexts)} contexts open, the service's limit per client")
        context_id = self._new_id()
        self.contexts[context_id] = (a, served, served.runner.open_stream())
        self.reply(req, a=context_id)

    def _context(self, context_id: int) -> tuple[int, ServedModel, Stream]:
        entry = self.contexts.get(context_id)
        if entry is None:
            raise ServiceError(StatusCode.INVALID_INPUT, f"context {context_id} is not open on this connection")
        return entry

    def _context_close(self, req: int, a: int, b: int, msg: Message) -> None:
        _, served, stream = self._context(a)
        del self.contexts[a]
        self._status_reply(req, served.runner, served.runner.close_stream(stream))

    def _state_get(self, req: int, a: int, b: int, msg: Message) -> None:
        _, served, stream = self._context(a)
        state = served.runner.get_stream_state(stream)
        self.reply_tensors(req, [_tensor_of(name, value, TensorDirection.INPUT) for name, value in state.items()])

    def _state_set(self, req: int, a: int, b: int, msg: Message) -> None:
        tensors = msg.tensors("STATE_SET")
        _, served, stream = self._context(a)
        state = {t.info.name: t.numpy().copy() for t in tensors}
        self._status_reply(req, served.runner, served.runner.set_stream_state(stream, state))

    def _state_reset(self, req: int, a: int, b: int, msg: Message) -> None:
        _, served, stream = self._context(a)
        self._status_reply(req, served.runner, served.runner.reset_stream(stream))

    def _status_reply(self, req: int, runner: Runner, status: StatusCode) -> None:
        if status is StatusCode.SUCCESS:
            self.reply(req)
        else:
            self.reply_error(req, status, runner.last_error)

    def _stats(self, req: int, a: int, b: int, msg: Message) -> None:
        self.reply(req, {"client": self.summary(), "service": self.service.summary()})

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {"client": self.sid, "pid": self.peer.pid, "uid": self.peer.uid, "runners": len(self.runners),
                    "bindings": len(self.bindings), "mapped_bytes": self.mapped, "contexts": len(self.contexts),
                    "jobs": self.jobs, "in_flight": self.in_flight}

    # -- the end ---------------------------------------------------------------------------------------------
    def _end(self) -> None:
        """The connection ended (closed, killed, or the handshake failed): free what the client held once its jobs
        in flight have ended and its other threads have left."""
        self._ended = True
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # threads still in recvmsg return
        except OSError:
            pass
        dropped = 0
        for served in set(self.runners.values()):
            for _ in served.queue.drop(self.sid):
                self.job_ended()
                dropped += 1
        self.wait_idle(time.monotonic() + 60)  # a running job may still write into its tensors
        me = threading.current_thread()
        for thread in list(self.threads):
            if thread is not me:
                thread.join(timeout=10)
        contexts = list(self.contexts.values())
        with self._lock:
            bindings, mapped = len(self.bindings), self.mapped
            self.bindings.clear()
            self.contexts.clear()
            self.mapped = 0
        for _, served, stream in contexts:
            served.runner.close_stream(stream)
        self.runners.clear()
        self.sock.close()
        if self.greeted:
            log.info("client %d disconnected: %s; %d jobs (%d dropped unrun); freed %d tensor sets (%.1f MiB), "
                     "%d contexts", self.sid, self.peer, self.jobs, dropped, bindings, mapped / 2**20, len(contexts))
        self.service.session_ended(self)


class Message:
    """One received datagram: its bytes, the fds that came with it, and whether those were taken."""

    __slots__ = ("data", "ancdata", "msg_flags", "flags", "consumed")

    def __init__(self, data: memoryview, ancdata: list[Any], msg_flags: int) -> None:
        self.data, self.ancdata, self.msg_flags = data, ancdata, msg_flags
        self.flags = 0
        self.consumed = False

    def doc(self) -> dict[str, Any]:
        return p.body_json(self.data)

    def tensors(self, what: str) -> list[NpuTensor]:
        """The message's tensors, mapped (npurt.share validates them and closes their fds)."""
        if not self.flags & p.FLAG_TENSORS:
            raise p.ProtocolError(f"{what}: the message carries no tensors (flag {p.FLAG_TENSORS})")
        self.consumed = True
        return p.unpack_tensors(self.data, self.ancdata, self.msg_flags)


def _status_of_message(e: Exception) -> tuple[StatusCode, str]:
    """Runner.run's exception as a status: its NpuError text starts with the status name."""
    if isinstance(e, ValueError):
        return StatusCode.INVALID_INPUT, str(e)
    name, sep, rest = str(e).partition(": ")
    if sep and name in StatusCode.__members__:
        return StatusCode[name], rest
    return StatusCode.RUNTIME_ERROR, str(e)


def _tensor_of(name: str, array: np.ndarray, direction: TensorDirection) -> NpuTensor:
    """An array's copy in memory of its own (a sealed memfd), to hand to the client by fd."""
    array = np.ascontiguousarray(array)
    info = NpuTensorInfo(name=name, data_type=DataType.from_numpy(array.dtype), shape=array.shape,
                         direction=direction, tensor_type=TensorType.CPU)
    tensor = allocate_tensor(info, MemoryType.XRT_BO, "memfd")
    if array.size:
        tensor.numpy()[...] = array
    return tensor


# ---------------------------------------------------------------------------------------------- the service
class Service:
    """Serves named models to the processes that connect to its socket."""

    def __init__(self, socket_path: str | Path, models: Mapping[str, str | Path], backend: str = "AUTO",
                 options: Mapping[str, Mapping[str, Any]] | None = None, limits: Limits | None = None,
                 workers: int | None = None, group: str | int | None = None) -> None:
        if not models:
            raise ValueError("npurt serve needs at least one model (--model NAME=PATH)")
        self.socket_path = Path(socket_path)
        self.models = {str(n): Path(m) for n, m in models.items()}
        self.backend = backend.upper()
        self._defaults = {n: dict((options or {}).get(n, {})) for n in self.models}
        self.limits = limits or Limits()
        self.workers = workers
        self.group = group
        self._served: dict[str, ServedModel] = {}
        self._load_lock = threading.Lock()
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._per_uid: dict[int, int] = {}
        self._next_sid = 1
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._stop_reason = ""
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.started = time.monotonic()

    # -- models ---------------------------------------------------------------------------------------------
    def model_defaults(self, name: str) -> dict[str, Any]:
        if name not in self.models:
            raise ServiceError(StatusCode.INVALID_INPUT, f"this service serves no model named {name!r}; it serves "
                                                         f"{sorted(self.models)}")
        return self._defaults[name]

    def served(self, name: str, requested: Mapping[str, Any]) -> ServedModel:
        """The served runner of ``name`` with these options, created (compiled) on first use."""
        defaults = self.model_defaults(name)
        options, key = p.merge_served(defaults, requested)
        full_key = f"{name}\0{key}"
        served = self._served.get(full_key)
        if served is not None:
            return served
        with self._load_lock:
            served = self._served.get(full_key)
            if served is not None:
                return served
            if self._stop.is_set():
                raise ServiceError(StatusCode.FAILURE, "the service is shutting down")
            if len(self._served) >= self.limits.max_runners:
                raise ServiceError(StatusCode.RESOURCE_UNAVAILABLE,
                                   f"the service runs {len(self._served)} models-with-options, its limit "
                                   f"(--max-runners {self.limits.max_runners}); open {name!r} with the options "
                                   f"others use: {list(s.options for s in self._served.values() if s.name == name)}")
            raw = p.served_options(options, {**defaults, **requested})
            t0 = time.perf_counter()
            runner = self._create_runner(self.models[name], raw)
            slots = self.workers or max(runner.max_concurrent_runs, _cores())
            served = ServedModel(name, key, raw, runner, slots)
            self._served[full_key] = served
            log.info("model %s (%s) loaded in %.0f ms: %s; options %s; %d runs at once", name,
                     self.models[name], (time.perf_counter() - t0) * 1e3, runner.device_info.summary(),
                     raw or "(defaults)", slots)
            return served

    def _create_runner(self, path: Path, options: dict[str, Any]) -> Runner:
        if self.backend == "AUTO":
            return create_auto(path, options)[0]
        return RunnerFactory.create_runner(self.backend, path, options)

    def models_summary(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self.models):
            loaded = [s for s in self._served.values() if s.name == name]
            out.append({"name": name, "defaults": self._defaults[name],
                        "loaded": [{"backend": s.runner.runner_type, "device": s.runner.device_info.attached,
                                    "options": s.options, "jobs": s.jobs_run} for s in loaded]})
        return out

    def summary(self) -> dict[str, Any]:
        with self._lock:
            clients = len(self._sessions)
        return {"pid": os.getpid(), "clients": clients, "runners": len(self._served),
                "queued": sum(len(s.queue) for s in self._served.values()),
                "uptime_s": round(time.monotonic() - self.started, 3)}

    # -- the socket -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Load every model with its defaults (so that READY means compiled), then listen."""
        for name in self.models:
            self.served(name, {})
        self._listener = self._listen()

    def _listen(self) -> socket.socket:
        path = self.socket_path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise NpuError(f"{path} exists and is not a socket; choose another --socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(str(path))
                raise NpuError(f"another service already listens on {path}")
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink()  # a stale socket of a service that is gone
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # the socket is born 0600: nobody else can connect in between
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        if self.group is not None:
            gid = _gid_of(self.group)
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
        sock.listen(128)
        return sock

    def serve_forever(self, on_ready: Callable[[], None] | None = None) -> None:
        """Accept clients until ``stop``; then drain and close."""
        if self._listener is None:
            self.start()
        assert self._listener is not None
        if on_ready is not None:
            on_ready()
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._listener:
                        self._accept()
        finally:
            sel.close()
            self._shutdown()

    def stop(self, reason: str = "asked to stop") -> None:
        """Begin a clean shutdown (safe from a signal handler)."""
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                log.warning("accept: %s (out of fds); refusing for now", e.strerror)
                time.sleep(0.05)
            return
        conn.set_inheritable(False)
        try:
            peer = peer_of(conn)
        except OSError:
            conn.close()
            return
        refused = self._admission(peer)
        if refused:
            log.warning("refused %s: %s", peer, refused)
            try:
                conn.setblocking(False)
                conn.send(p.pack_json(p.NOTICE, 0, {"refused": refused}))
            except OSError:
                pass
            conn.close()
            return
        with self._lock:
            sid = self._next_sid
            self._next_sid += 1
            session = Session(self, conn, sid, peer)
            self._sessions[sid] = session
            self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
        session.start()

    def _admission(self, peer: Peer) -> str:
        limits = self.limits
        if limits.allowed_uids is not None and peer.uid not in limits.allowed_uids:
            return f"uid {peer.uid} may not use this service (allowed: {sorted(limits.allowed_uids)})"
        with self._lock:
            if len(self._sessions) >= limits.max_clients:
                return f"the service has {len(self._sessions)} clients, its limit (--max-clients {limits.max_clients})"
            n = self._per_uid.get(peer.uid, 0)
            if n >= limits.max_connections_per_uid:
                return (f"uid {peer.uid} has {n} connections open, the service's limit per uid "
                        f"(--max-connections-per-uid {limits.max_connections_per_uid})")
        return ""

    def session_ended(self, session: Session) -> None:
        with self._lock:
            if self._sessions.pop(session.sid, None) is not None:
                n = self._per_uid.get(session.peer.uid, 1) - 1
                if n:
                    self._per_uid[session.peer.uid] = n
                else:
                    self._per_uid.pop(session.peer.uid, None)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    # -- the end ---------------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        reason = self._stop_reason or "asked to stop"
        log.info("shutting down (%s): no new clients or jobs; letting the jobs in flight end", reason)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass
        sessions = self.sessions()
        for s in sessions:
            s.send(p.pack_json(p.NOTICE, 0, {"shutdown": reason}))
        time.sleep(SHUTDOWN_GRACE_S)  # runs already on their way in are taken; clients told refuse new ones
        for s in sessions:
            s.draining = True
        deadline = time.monotonic() + self.limits.drain_timeout_s
        for s in sessions:
            if not s.wait_idle(deadline):
                break
        failed = 0
        for served in list(self._served.values()):
            for job in served.queue.drop():
                job.session.reply_done(job.req, StatusCode.FAILURE,
                                       f"the service shut down ({reason}) before the job ran", None)
                job.session.job_ended()
                failed += 1
        if failed:
            log.warning("%d queued jobs ended unrun after %.0f s of draining", failed, self.limits.drain_timeout_s)
        for s in sessions:
            try:
                s.sock.shutdown(socket.SHUT_RDWR)  # the reader sees the end and frees the client's state
            except OSError:
                pass
        for s in sessions:
            s.threads[0].join(timeout=self.limits.drain_timeout_s)
        for s in sessions:
            for thread in list(s.threads):
                thread.join(timeout=self.limits.drain_timeout_s)
        for served in list(self._served.values()):
            try:
                served.close()
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("closing model %s", served.name)
        self._served.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)
        log.info("stopped")


def _gid_of(group: str | int) -> int:
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise ValueError(f"--group {group!r}: no such group") from None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


__all__ = ["FairQueue", "Limits", "Peer", "Service", "ServiceError", "Session"]
