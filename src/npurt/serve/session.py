"""One client of ``npurt serve``: its connection, and what it holds in the service.

A ``Session`` is one client: the runners it opened (``ServedModel``s, shared with other clients), the tensors it
registered (imported with ``npurt.share``'s validated fd import: dma-bufs and memfds sealed against shrinking only),
its stream contexts and jobs. Ids are per session, so a client names only its own; when the client goes (closed,
killed), everything it held is freed once its jobs in flight end. A ``Message`` is one datagram it sent; a request
the service refuses raises ``ServiceError``, which the session answers with its status and message.

A session is its jobs' ``JobOwner``: the served model runs them and answers through it. It owns its connection, its
threads and its end (``notify``, ``drain``, ``close``); what it needs of the service is the ``SessionHost``
interface, so that it imports nothing of the server.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ..runner import Runner
from ..streams import Stream
from ..tensor import NpuTensor, allocate_tensor
from ..types import DataType, MemoryType, NpuError, NpuTensorInfo, StatusCode, TensorDirection, TensorType
from . import protocol as p
from .limits import Limits, Peer
from .protocol import ServiceError
from .served import Binding, Job, ServedModel
from .turns import ReadTurns

log = logging.getLogger("npurt.serve")

_RECV_FLAGS = int(socket.MSG_CMSG_CLOEXEC)  # (an int: the enum's own operators cost microseconds per message)


class SessionHost(Protocol):
    """What a session asks of the service that accepted it."""

    limits: Limits

    def model_defaults(self, name: str) -> dict[str, Any]:
        """The served options of model ``name`` (ServiceError for a model it does not serve)."""

    def served(self, name: str, requested: Mapping[str, Any]) -> ServedModel:
        """The served runner of ``name`` with these options, loaded on first use."""

    def models_summary(self) -> list[dict[str, Any]]:
        """What the service serves."""

    def summary(self) -> dict[str, Any]:
        """The service's counters."""

    def session_ended(self, session: Session) -> None:
        """The session has freed everything it held."""


class Session:
    """One client connection: its runners, registered tensors, contexts and jobs, and the threads that serve it.

    Its threads take turns to read the connection (``ReadTurns``): a reader that runs a job at once leaves the turn
    to whichever of the others a message wakes meanwhile (one more is started where none would be left), and reads
    again after the run if nobody took over. The first thread to see the connection end frees the client's state."""

    def __init__(self, service: SessionHost, sock: socket.socket, sid: int, peer: Peer) -> None:
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
        self.turns = ReadTurns(sock.fileno())
        self.threads: list[threading.Thread] = []
        self.greeted = False

    def start(self) -> None:
        self._spawn(self._first)

    def _spawn(self, target: Callable[[], None]) -> None:
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
                if ancdata:
                    self._send_locked(message, ancdata)
                else:
                    try:  # (the socket has room for it, but where a client leaves its answers unread)
                        self.sock.send(message, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        self._send_locked(message, None)
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
        self.turns.back()  # (a job run on the thread that read it: the turn first, then the answer)
        if status is StatusCode.SUCCESS and not shapes:
            self.send(p.HEAD.pack(p.DONE, 0, 0, 0, 0, req))
            return
        doc: dict[str, Any] = {}
        if message:
            doc["error"] = message[:8000]
        if shapes:
            doc["shapes"] = shapes
        self.send(p.pack_json(p.DONE, req, doc, status=int(status)))

    def reply_outputs(self, req: int, outputs: dict[str, np.ndarray]) -> None:
        """A RUN_ARRAYS answer: the output arrays go back in memory of their own (new memfds)."""
        self.reply_tensors(req, [_tensor_of(name, array, TensorDirection.OUTPUT) for name, array in outputs.items()])

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

    # -- the service's shutdown -------------------------------------------------------------------------------
    def notify(self, doc: Mapping[str, Any]) -> None:
        """An unsolicited message (a NOTICE): the service is shutting down."""
        self.send(p.pack_json(p.NOTICE, 0, doc))

    def drain(self, deadline: float) -> bool:
        """Take no new jobs; wait until the ones in flight have ended (False: ``deadline`` passed first)."""
        self.draining = True
        return self.wait_idle(deadline)

    def close(self, timeout: float) -> None:
        """End the connection and wait for the session's threads, the first of which frees its state."""
        self.disconnect()
        if self.threads:
            self.threads[0].join(timeout=timeout)
        for thread in list(self.threads):
            thread.join(timeout=timeout)

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
        self.turns.take()
        try:
            ok = self._handshake()
        except Exception:  # noqa: BLE001
            log.exception("client %d: unexpected error in the handshake", self.sid)
            ok = False
        if ok:
            self._serve(True)
        else:
            self._end()

    def _watcher(self) -> None:
        if self.turns.watch(counted=True):
            self._serve(True)

    def _serve(self, reads: bool) -> None:
        """One of the session's threads, until the connection ends: it reads while it has the turn, else waits for
        it (``reads``: it has it now)."""
        turns = self.turns
        try:
            while reads or turns.watch():
                reads = False
                if not self._read():  # the connection ended (else this thread ran a job and another reads now)
                    break
        except Exception:  # noqa: BLE001 - one client's trouble never takes the service down
            log.exception("client %d: unexpected error; closing its connection", self.sid)
            self.disconnect()  # the other threads see the end too
        if turns.end():
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

    def _read(self) -> bool:
        """Read and handle messages while this thread has the turn: False when the connection ends, True when this
        thread ran a job and another took the turn meanwhile."""
        buffer = bytearray(p.MAX_MESSAGE + 1)
        view = memoryview(buffer)
        handlers = self._handlers()
        recvmsg_into = self.sock.recvmsg_into
        buffers, head, unpack_from, run, flags = [buffer], p.HEAD.size, p.HEAD.unpack_from, p.RUN, _RECV_FLAGS
        while True:
            try:
                n, ancdata, msg_flags, _ = recvmsg_into(buffers, p.ANCILLARY_SIZE, flags)
            except OSError:
                return False
            if n == head and not ancdata and buffer[0] == run:  # the hot path first: RUN, a head alone
                _, _, _, a, b, req = unpack_from(buffer)
                if not self._run(req, a, b):
                    return True
                continue
            if n == 0:
                return False
            message = Message(view[:n], ancdata, msg_flags)
            try:
                if n < head or n > p.MAX_MESSAGE:
                    log.warning("client %d: a message of %d bytes; ignored", self.sid, n)
                    continue
                kind, _, message.flags, a, b, req = unpack_from(buffer)
                if kind == run:  # (with fds, closed below)
                    if not self._run(req, a, b):
                        return True
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
            signature = [tuple(p.ints(s, "COMPILE signature")) for s in signature]
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

    def _run(self, req: int, binding_id: int, context_id: int) -> bool:
        """RUN: run the job on this thread when the model has a free slot and nobody queues, else queue it. Whether
        this thread still has the turn to read (it leaves it for a run, and may find it taken after)."""
        binding = self.bindings.get(binding_id)
        try:
            if binding is None:
                raise ServiceError(StatusCode.INVALID_INPUT, f"tensor set {binding_id} is not registered on this "
                                                             "connection")
            served = binding.served
            job = Job(self, req, binding, self._stream(context_id, served) if context_id or served.stateful else None)
            if not served.try_slot():
                self._accept_job(served, job)
                return True
            try:
                self._count_job()
            except ServiceError:
                served.release_slot()
                raise
            if self.turns.leave():
                self._spawn(self._watcher)  # someone must read the client's next messages meanwhile
            try:
                served.run_inline(job, self._again)
            finally:
                reads = self.turns.rejoin()
            return reads
        except ServiceError as e:
            self.reply_done(req, e.status, str(e), None)
            return True

    def _again(self) -> None:
        """This thread is to run another client's queued job after its own: it leaves the turn to read."""
        if self.turns.again():
            self._spawn(self._watcher)

    def _run_arrays(self, req: int, a: int, b: int, msg: Message) -> None:
        tensors = msg.tensors("RUN_ARRAYS")
        served = self._runner(a)
        # the arrays are views of the mapped tensors: they keep the client's memory mapped until the job is gone
        feeds = {t.info.name: t.numpy() for t in tensors}
        self._accept_job(served, Job(self, req, None, self._stream(b, served), feeds))

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
        self.turns.end()
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # threads still in recvmsg return
        except OSError:
            pass
        dropped = sum(served.drop_jobs(self.sid) for served in set(self.runners.values()))
        self.wait_idle(time.monotonic() + 60)  # a running job may still write into its tensors
        me = threading.current_thread()
        for thread in list(self.threads):
            if thread is not me:
                thread.join(timeout=10)
        self.turns.close()
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


def _tensor_of(name: str, array: np.ndarray, direction: TensorDirection) -> NpuTensor:
    """An array's copy in memory of its own (a sealed memfd), to hand to the client by fd."""
    array = np.ascontiguousarray(array)
    info = NpuTensorInfo(name=name, data_type=DataType.from_numpy(array.dtype), shape=array.shape,
                         direction=direction, tensor_type=TensorType.CPU)
    tensor = allocate_tensor(info, MemoryType.XRT_BO, "memfd")
    if array.size:
        tensor.numpy()[...] = array
    return tensor


__all__ = ["Message", "ServiceError", "Session", "SessionHost"]
