"""``npurt serve``: one process owns the runners (the device, the compiled models); clients run them through it.

``Service`` listens on an AF_UNIX SOCK_SEQPACKET socket (mode 0600, or 0660 for a group), identifies each peer by
SO_PEERCRED (``Peer``), refuses uids it does not allow and connections over its ``Limits``, and gives every accepted
connection a ``Session`` (``npurt.serve.session``) on a thread of its own. It loads the served models
(``ServedModel``, ``npurt.serve.served``) and, with an ``OipConfig``, serves the same models and jobs over KServe's
Open Inference Protocol too (``npurt.serve.oip``: HTTP and gRPC). On ``stop`` it drains the jobs and requests already
accepted (new requests get 503 meanwhile), tells the clients, and closes everything.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..factory import RunnerFactory, create_auto
from ..options import cores
from ..runner import Runner
from ..types import NpuError, StatusCode
from . import protocol as p
from .limits import Limits, Peer, peer_of
from .protocol import ServiceError
from .served import ServedModel
from .session import Session

if TYPE_CHECKING:
    from .oip.metrics import ServeMetrics
    from .oip.server import OipConfig, OipServer
    from .oip.shm import SharedMemoryRegions
    from .openai.kinds import ModelKind, ServedKind

log = logging.getLogger("npurt.serve")

SHUTDOWN_GRACE_S = 0.25  # after telling clients of a shutdown, runs still come in for this long (sent before)


class Service:
    """Serves named models to the processes that connect to its socket."""

    def __init__(self, socket_path: str | Path, models: Mapping[str, str | Path], backend: str = "AUTO",
                 options: Mapping[str, Mapping[str, Any]] | None = None, limits: Limits | None = None,
                 workers: int | None = None, group: str | int | None = None, oip: OipConfig | None = None,
                 kinds: Sequence[ModelKind] = ()) -> None:
        self.kinds = tuple(k for k in kinds if k.folders)
        if not models and not self.kinds:
            raise ValueError("npurt serve needs at least one model (--model NAME=PATH, or --generate, --embed or "
                             "--transcribe NAME=DIR)")
        seen: dict[str, str] = {str(n): "--model" for n in models}
        for kind in self.kinds:
            if oip is None or oip.http is None:
                raise ValueError(f"{kind.flag} serves {kind.what} over HTTP (OpenAI's API): give --http HOST:PORT")
            for name in kind.names:
                if name in seen:
                    raise ValueError(f"the name {name!r} is given to {seen[name]} and to {kind.flag}")
                seen[name] = kind.flag
        self.served_kinds: list[ServedKind] = []  # loaded at start
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
        self.oip_config = oip if oip is not None and oip.enabled else None
        self.oip: OipServer | None = None
        self.metrics: ServeMetrics | None = None
        self.regions: SharedMemoryRegions | None = None
        if self.oip_config is not None:  # imported only when asked for: they need the 'serve' extra
            from .oip.metrics import ServeMetrics
            from .oip.shm import SharedMemoryRegions

            regions = self.regions = SharedMemoryRegions(enabled=self.oip_config.shm_enabled)
            self.metrics = ServeMetrics(self._runner_stats, lambda: regions.count)

    def _runner_stats(self) -> dict[str, dict[str, int]]:
        return {s.name: s.runner.stats for s in list(self._served.values())}

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
            slots = self.workers or max(runner.max_concurrent_runs, cores())
            served = ServedModel(name, key, raw, runner, slots, self.metrics)
            self._served[full_key] = served
            log.info("model %s (%s) loaded in %.0f ms: %s; options %s; %d runs at once", name,
                     self.models[name], (time.perf_counter() - t0) * 1e3, runner.device_info.summary(),
                     raw or "(defaults)", slots)
            return served

    def _load_kinds(self) -> None:
        """Each --generate / --embed / --transcribe kind's models, compiled now (before READY)."""
        registry = self.metrics.registry if self.metrics is not None else None
        try:
            for kind in self.kinds:
                self.served_kinds.append(kind.load(self.backend, registry))
        except BaseException:
            for served in self.served_kinds:
                served.close("the server failed to start")
            raise

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
                "queued": sum(s.queued for s in self._served.values()),
                "uptime_s": round(time.monotonic() - self.started, 3)}

    # -- the socket -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Load every model with its defaults (so that READY means compiled), then listen."""
        for name in self.models:
            self.served(name, {})
        extra = None
        if self.kinds:
            self._load_kinds()
            from .openai.routes import OpenAiRoutes

            extra = OpenAiRoutes(self.served_kinds)
        self._listener = self._listen()
        if self.oip_config is not None:
            from .oip.server import OipServer

            assert self.regions is not None
            oip = OipServer(self.oip_config, {n: self.served(n, {}) for n in self.models}, self.metrics, self.regions,
                            extra, tuple(name for kind in self.kinds for name in kind.names))
            try:
                oip.start()
            except BaseException:
                oip.stop()
                raise
            self.oip = oip

    def _listen(self) -> socket.socket:
        path = self.socket_path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_directory(path.parent)
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
        try:
            session = Session(self, conn, sid, peer)
        except OSError as e:  # its epoll and eventfd (out of fds)
            log.warning("accept: %s; closed the connection of %s", e.strerror, peer)
            conn.close()
            return
        with self._lock:
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
        deadline = time.monotonic() + SHUTDOWN_GRACE_S + self.limits.drain_timeout_s
        if self.oip is not None:
            self.oip.refuse_new()  # new requests get 503 from now on; those in flight finish
        for kind in self.served_kinds:
            kind.refuse_new("the server is shutting down: it takes no new requests")
        sessions = self.sessions()
        for s in sessions:
            s.notify({"shutdown": reason})
        time.sleep(SHUTDOWN_GRACE_S)  # runs already on their way in are taken; clients told refuse new ones
        for s in sessions:
            if not s.drain(deadline):
                break
        for kind in self.served_kinds:
            if not kind.drain(deadline):
                log.warning("%d requests still running or queued at the end of the drain: they end with an error",
                            kind.active)
            kind.close(f"the server shut down ({reason}) before the request ended")
        if self.oip is not None:
            self.oip.drain(deadline)
            self.oip.stop()
        why = f"the service shut down ({reason}) before the job ran"
        failed = sum(served.drop_jobs(None, why) for served in list(self._served.values()))
        if failed:
            log.warning("%d queued jobs ended unrun after %.0f s of draining", failed, self.limits.drain_timeout_s)
        for s in sessions:
            s.disconnect()  # the reader sees the end and frees the client's state
        for s in sessions:
            s.close(self.limits.drain_timeout_s)
        for served in list(self._served.values()):
            try:
                served.close()
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("closing model %s", served.name)
        self._served.clear()
        if self.regions is not None:
            self.regions.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        log.info("stopped")


def _check_directory(directory: Path) -> None:
    """NpuError unless only this server's user (or root) can replace files in the socket's directory: whoever may
    write there may swap the socket for their own and read every client's tensors (a /tmp/npurt-<uid> another user
    made first, say). A sticky directory (/tmp) lets nobody remove another's file."""
    st = os.stat(directory)
    if st.st_uid not in (os.geteuid(), 0):
        raise NpuError(f"the socket's directory {directory} belongs to uid {st.st_uid}, not to this server's "
                       f"({os.geteuid()}): its owner could replace the socket; choose another --socket")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise NpuError(f"the socket's directory {directory} is writable by others (mode {oct(st.st_mode & 0o7777)}) "
                       "and not sticky: they could replace the socket; choose another --socket or chmod it")


def _gid_of(group: str | int) -> int:
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise ValueError(f"--group {group!r}: no such group") from None


__all__ = ["Limits", "Peer", "Service", "ServiceError", "peer_of"]
