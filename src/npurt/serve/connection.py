"""One connection to an ``npurt serve`` (``Connection``): the handshake, requests and their ``Reply``s, and who
reads the socket (a caller blocked in a run reads its own answer; a reader thread reads for callbacks and queries).

It knows the wire protocol only, not runners: ``npurt.serve.remote`` (a Runner's engine over a connection) and
``npurt.serve.client`` (``ServiceClient``: a connection that opens runners) sit above it.

When the connection is lost (the service stopped, restarted or was killed) every run waiting on it, and every later
one, ends with FAILURE and a message saying so; requests that are queries raise NpuError. Nothing waits forever.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..tensor import NpuTensor
from ..types import NpuError, StatusCode
from . import protocol as p

log = logging.getLogger("npurt.serve")

CONNECT_TIMEOUT_S = 10.0
_RECV_FLAGS = int(socket.MSG_CMSG_CLOEXEC)  # (an int: the enum's own operators cost microseconds per message)
_HEAD_SIZE = p.HEAD.size
_unpack_head = p.HEAD.unpack_from
_C = TypeVar("_C", bound="Connection")


class Reply:
    """A service's answer: its status, numbers, JSON body (or error text) and the tensors that came with it."""

    __slots__ = ("kind", "status", "a", "b", "doc", "tensors")

    def __init__(self, kind: int, status: StatusCode, a: int, b: int, doc: dict[str, Any],
                 tensors: list[NpuTensor] | None = None) -> None:
        self.kind, self.status, self.a, self.b, self.doc, self.tensors = kind, status, a, b, doc, tensors

    @property
    def error(self) -> str:
        return str(self.doc.get("error", ""))


class _Closed(ConnectionError):
    """The service closed the connection (an orderly end of the stream)."""


class _Pending:
    """One request waiting for its reply: a caller (``lock``, made when it must wait for someone else to read,
    released when the reply is delivered or when it is to read itself) or a callback (``on_reply``)."""

    __slots__ = ("lock", "reply", "on_reply", "signalled")

    def __init__(self, on_reply: Any = None) -> None:
        self.on_reply = on_reply
        self.reply: Reply | None = None
        self.signalled = False
        self.lock: threading.Lock | None = None


class Connection:
    """One connection to an ``npurt serve``; thread-safe, shared by every runner opened through it.

    Whoever waits for an answer reads the connection itself when nobody else does (a thread blocked in a run is
    woken by the kernel with its own answer: no thread handoff on the way back); a reader hands answers that are
    not its own to their callers. The reader thread reads only while answers are awaited and no caller reads:
    for ``execute_async`` jobs and queries."""

    def __init__(self, socket_path: str | Path | None = None, timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.socket_path = Path(socket_path) if socket_path is not None else p.default_socket_path()
        self.timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # the pending table, who reads, the connection's state
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._reading = False  # a thread is reading the connection
        self._lost = ""  # why the connection is gone ("" while it is up)
        self._closing = False
        self._unbind: list[int] = []  # registrations whose tensors are gone, to tell the service
        self._buffer = bytearray(p.MAX_MESSAGE + 1)  # for whichever thread reads (one at a time)
        self._view = memoryview(self._buffer)
        self.stopping = ""  # the service said it is shutting down
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(str(self.socket_path))
            hello = self._handshake()
            self._sock.settimeout(None)
        except BaseException:
            self._sock.close()
            raise
        self.server_pid: int = hello.doc.get("pid", 0)
        self.client_id: int = hello.doc.get("client", 0)
        self.limits: dict[str, Any] = hello.doc.get("limits", {})
        self._wanted = threading.Event()  # the reader thread is wanted
        self._reader = threading.Thread(target=self._reader_thread, name="npurt-serve-reader", daemon=True)
        self._reader.start()

    @classmethod
    def open(cls: type[_C], socket: str | Path | None = None, timeout: float = CONNECT_TIMEOUT_S) -> _C:
        """Connect to an ``npurt serve`` (default socket: ``$NPURT_SERVICE``, else
        ``$XDG_RUNTIME_DIR/npurt/serve.sock``).

        NpuError when no service listens there, or it refuses this process (its uid, or a limit: the message says)."""
        path = Path(socket) if socket is not None else p.default_socket_path()
        try:
            return cls(path, timeout)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise NpuError(f"no npurt service listens at {path} ({e.strerror}); start one with 'npurt serve --model "
                           "NAME=PATH'") from None
        except PermissionError as e:
            raise NpuError(f"the npurt service at {path} does not let this user in ({e.strerror}): its socket's "
                           "permissions, see 'npurt serve --group'") from None

    def _handshake(self) -> Reply:
        try:
            self._sock.send(p.pack_json(p.HELLO, 0, {"magic": p.MAGIC, "version": p.VERSION, "pid": os.getpid()}))
        except OSError:
            pass  # a refusing service has closed already: its reason is in the socket
        try:
            try:
                data = self._sock.recv(p.MAX_MESSAGE + 1)
            except ConnectionResetError:
                # A refusing service closes without reading our HELLO: the kernel reports the reset first, and the
                # reason it sent is still there to read.
                data = self._sock.recv(p.MAX_MESSAGE + 1, socket.MSG_DONTWAIT)
        except (TimeoutError, OSError) as e:
            raise NpuError(f"the npurt service at {self.socket_path} did not answer: {e}") from None
        if not data:
            raise NpuError(f"the npurt service at {self.socket_path} closed the connection at once")
        kind, status, _, _, _, _ = p.unpack(data)
        doc = p.body_json(data)
        if kind == p.NOTICE and "refused" in doc:
            raise NpuError(f"the npurt service at {self.socket_path} refused this client: {doc['refused']}")
        if kind != p.REPLY or status:
            raise NpuError(f"the npurt service at {self.socket_path} answered HELLO with {doc}")
        return Reply(kind, StatusCode.SUCCESS, 0, 0, doc)

    # -- sending ------------------------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return not self._lost

    def _register(self, pending: _Pending) -> int:
        req = next(self._ids)
        with self._lock:
            if self._lost:
                raise ConnectionError(self._lost)
            self._pending[req] = pending
        return req

    def _send(self, message: bytes, ancdata: list[Any] | None = None) -> None:
        with self._send_lock:
            if self._unbind:
                self._flush_unbind()
            if ancdata:
                self._sock.sendmsg([message], ancdata)
            else:
                self._sock.send(message)

    def _flush_unbind(self) -> None:
        ids, self._unbind = self._unbind, []
        for binding_id in ids:
            self._sock.send(p.pack(p.UNBIND, 0, binding_id))

    def forget_binding(self, binding_id: int) -> None:
        """A registration's tensors are gone: tell the service (now if the connection is free, else with the next
        message; a finalizer may run on a thread that is sending)."""
        self._unbind.append(binding_id)
        if self._lost or not self._send_lock.acquire(blocking=False):
            return
        try:
            if self._unbind:
                self._flush_unbind()
        except OSError:
            pass
        finally:
            self._send_lock.release()

    def _submit(self, pending: _Pending, message: Any) -> int:
        """Register and send one request (``message(req)``: its bytes, or its bytes and fds); where that fails, the
        pending request gets a FAILURE reply."""
        try:
            req = self._register(pending)
        except ConnectionError as e:
            self._deliver(pending, Reply(p.REPLY, StatusCode.FAILURE, 0, 0, {"error": str(e)}))
            return 0
        try:
            data = message(req)
            if isinstance(data, tuple):
                self._send(*data)
            else:
                self._send(data)
        except ValueError as e:
            self._fail_pending(req, f"cannot send to the npurt service at {self.socket_path}: {e}")
        except OSError as e:
            self._lose(self._why_lost(e))
        return req

    def _why_lost(self, error: OSError) -> str:
        """Why sending failed: what the service said before it went (unread if nobody was reading), else the error."""
        self._drain()
        return self._lost_message(error)

    def _drain(self) -> None:
        """Read what is already there (answers, notices, the end of the connection) without waiting, where nobody
        reads."""
        with self._lock:
            reading, self._reading = self._reading, True
        if reading:
            return
        try:
            while True:
                self._read_one(socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        except (OSError, ValueError) as e:
            self._lose(self._lost_message(e))
        finally:
            self._stop_reading()

    def _lost_message(self, error: BaseException) -> str:
        """What a client is told when the connection is gone."""
        where = f"the npurt service at {self.socket_path}"
        if self.stopping:
            return f"{where} shut down ({self.stopping})"
        if isinstance(error, (_Closed, ConnectionResetError, BrokenPipeError)):
            how = "" if isinstance(error, _Closed) else f": {error.strerror}"
            return (f"{where} closed the connection (it stopped, restarted or was killed{how}); open the runner "
                    "again once it is back")
        return f"the connection to {where} failed: {error}"

    def request(self, kind: int, doc: Mapping[str, Any] | None = None, a: int = 0, b: int = 0,
                tensors: Sequence[NpuTensor] | None = None, timeout: float | None = None) -> Reply:
        """One request and its reply (a FAILURE reply when the connection is gone; NpuError on timeout)."""
        pending = _Pending()
        if tensors is not None:
            req = self._submit(pending, lambda r: p.pack_tensors(kind, r, tensors, a, b))
        elif doc is not None:
            req = self._submit(pending, lambda r: p.pack_json(kind, r, doc, a, b))
        else:
            req = self._submit(pending, lambda r: p.pack(kind, r, a, b))
        reply = self._wait(pending, req, timeout, read=False)
        if reply is None:
            raise NpuError(f"the npurt service at {self.socket_path} did not answer within {timeout} s")
        return reply

    def call(self, kind: int, doc: Mapping[str, Any] | None = None, a: int = 0, b: int = 0,
             tensors: Sequence[NpuTensor] | None = None) -> Reply:
        """A request whose failure is an exception (ValueError for what the service calls bad input)."""
        reply = self.request(kind, doc, a, b, tensors)
        if reply.status is not StatusCode.SUCCESS:
            if reply.status is StatusCode.INVALID_INPUT:
                raise ValueError(reply.error)
            raise NpuError(reply.error if reply.status is StatusCode.FAILURE
                           else f"{reply.status.name}: {reply.error}")
        return reply

    def run(self, binding_id: int, context_id: int, on_reply: Any = None) -> Reply | None:
        """RUN a registration: the reply (blocking), or None at once with ``on_reply(reply)`` called later."""
        if self.stopping:
            self._drain()  # gone by now?
        if self.stopping and not self._lost:  # the service said it is shutting down: it would refuse the job
            reply = Reply(p.DONE, StatusCode.FAILURE, 0, 0, {
                "error": f"the npurt service at {self.socket_path} is shutting down ({self.stopping}): no new jobs"})
            if on_reply is None:
                return reply
            on_reply(reply)
            return None
        pending = _Pending(on_reply)
        req = self._submit(pending, lambda r: p.HEAD.pack(p.RUN, 0, 0, binding_id, context_id, r))
        if on_reply is not None:
            if not self._reading:
                self._wanted.set()
            return None
        return self._wait(pending, req, None, read=True)

    # -- receiving ----------------------------------------------------------------------------------------------
    def _wait(self, pending: _Pending, req: int, timeout: float | None, read: bool) -> Reply | None:
        """The reply to ``pending``: read the connection while nobody else does (``read``), else wait for it to be
        handed over. None on timeout."""
        while True:
            with self._lock:
                if pending.reply is not None:
                    return pending.reply
                mine = read and not self._reading
                if mine:
                    self._reading = True
                else:
                    lock = pending.lock
                    if lock is None:
                        lock = pending.lock = threading.Lock()
                        lock.acquire()
                    pending.signalled = False
            if mine:
                self._read_while(pending)
                reply = pending.reply  # (this thread's own, set as it read it)
                if reply is not None:
                    return reply
                continue
            if not self._reading:
                self._wanted.set()
            assert lock is not None
            if not lock.acquire(timeout=-1 if timeout is None else timeout):
                with self._lock:
                    if pending.reply is None:
                        self._pending.pop(req, None)
                        return None

    def _read_while(self, pending: _Pending | None) -> None:
        """Read answers until ``pending`` has its own (None: until none is awaited), then let another read."""
        try:
            while True:
                if pending is not None:
                    if pending.reply is not None:
                        break
                else:
                    with self._lock:
                        if not self._pending or self._lost:
                            break
                self._read_one(0, pending)
        except (OSError, ValueError) as e:  # the end of the connection (_Closed) among them
            self._lose(self._lost_message(e))
        finally:
            self._stop_reading()

    def _stop_reading(self) -> None:
        """Stop reading; if answers are still awaited, wake a caller waiting for one (it reads next), else the
        reader thread (for callbacks)."""
        with self._lock:
            self._reading = False
            if not self._pending or self._lost:
                return
            for entry in self._pending.values():
                if entry.lock is not None and not entry.signalled:  # a caller waiting: it reads next
                    entry.signalled = True
                    entry.lock.release()
                    return
        self._wanted.set()

    def _read_one(self, flags: int = 0, own: _Pending | None = None) -> None:
        """Read one message and deliver it (``own``: the reading caller's request, whose answer it takes itself)."""
        n, ancdata, msg_flags, _ = self._sock.recvmsg_into([self._buffer], p.ANCILLARY_SIZE, _RECV_FLAGS | flags)
        if n == 0:
            raise _Closed()
        if n < _HEAD_SIZE:
            raise p.ProtocolError(f"a message of {n} bytes; the head alone is {_HEAD_SIZE}")
        kind, status, flags, a, b, req = _unpack_head(self._buffer)
        if n == _HEAD_SIZE and not ancdata and not flags and kind != p.NOTICE:  # a bare answer (a DONE): no body
            with self._lock:
                pending = self._pending.pop(req, None)
            if pending is own and own is not None:  # the reader's own answer: nobody else waits for it
                own.reply = Reply(kind, p.status_name(status), a, b, {})
            elif pending is not None:
                self._deliver(pending, Reply(kind, p.status_name(status), a, b, {}))
            return
        data = self._view[:n]
        tensors = None
        if flags & p.FLAG_TENSORS:
            tensors = p.unpack_tensors(data, ancdata, msg_flags)
            doc: dict[str, Any] = {}
        else:
            if ancdata:
                p.close_fds(ancdata)
            doc = p.body_json(data) if n > p.HEAD.size else {}
        if kind == p.NOTICE:
            self.stopping = str(doc.get("shutdown", doc))
            log.info("npurt serve client: the service is shutting down: %s", self.stopping)
            return
        with self._lock:
            pending = self._pending.pop(req, None)
        if pending is not None:  # else: an answer nobody waits for any more (a request that timed out)
            self._deliver(pending, Reply(kind, p.status_name(status), a, b, doc, tensors))

    def _deliver(self, pending: _Pending, reply: Reply) -> None:
        if pending.on_reply is not None:
            try:
                pending.on_reply(reply)
            except Exception:  # noqa: BLE001 - the reader must live on
                log.exception("npurt serve client: handling a reply failed")
            return
        with self._lock:
            pending.reply = reply
            if pending.lock is not None and not pending.signalled:
                pending.signalled = True
                pending.lock.release()

    def _fail_pending(self, req: int, why: str) -> None:
        with self._lock:
            pending = self._pending.pop(req, None)
        if pending is not None:
            self._deliver(pending, Reply(p.REPLY, StatusCode.FAILURE, 0, 0, {"error": why}))

    def _reader_thread(self) -> None:
        """Reads while answers are awaited that no caller reads for (callbacks of execute_async, queries)."""
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closing or self._lost:
                return
            with self._lock:
                if self._reading or not self._pending:
                    continue
                self._reading = True
            self._read_while(None)

    def _lose(self, why: str) -> None:
        with self._lock:
            if not self._lost:
                self._lost = why
            pending, self._pending = list(self._pending.values()), {}
        for entry in pending:
            self._deliver(entry, Reply(p.REPLY, StatusCode.FAILURE, 0, 0, {"error": self._lost}))
        self._wanted.set()

    # -- the end -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection; runners opened through it fail from then on (close them first)."""
        try:
            with self._send_lock:
                if self._unbind and not self._lost:
                    self._flush_unbind()
        except OSError:
            pass
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._lose(f"the connection to the npurt service at {self.socket_path} was closed by this client")
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        self._sock.close()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self.connected else f"lost: {self._lost}"
        return f"<{type(self).__name__} {self.socket_path} (service pid {self.server_pid}) {state}>"


__all__ = ["CONNECT_TIMEOUT_S", "Connection", "Reply"]
