"""Starting ``npurt serve`` from a program (a script, a test, a benchmark) and knowing when it is ready.

``ServiceProcess.start(models, socket)`` runs ``python -m npurt serve`` and returns once the service said READY on
its ``--ready-fd`` (its models are compiled and it listens), or raises with what it printed. With ``--http`` /
``--grpc`` (port 0: any free port), ``http_address`` / ``grpc_address`` say where it listens. ``stop()`` sends
SIGTERM and waits for the clean shutdown; ``kill()`` is the crash a client must survive.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ..types import NpuError


class ServiceProcess:
    """An ``npurt serve`` child process."""

    def __init__(self, process: subprocess.Popen[bytes], socket_path: Path, log: IO[bytes]) -> None:
        self.process = process
        self.socket_path = socket_path
        self._log: IO[bytes] | None = log
        self._text = ""  # what it printed, once it has exited (the file is closed then)
        self.http_address = ""  # HOST:PORT of the Open Inference Protocol over HTTP, where it listens
        self.grpc_address = ""

    @classmethod
    def start(cls, models: Mapping[str, str | Path], socket_path: str | Path, args: Sequence[str] = (),
              timeout: float = 120.0, env: Mapping[str, str] | None = None) -> ServiceProcess:
        """Start a service for ``models`` (name -> model file) on ``socket_path``; ``args``: more ``npurt serve``
        flags (``--device CPU``, ``--shape x=1,3,48,192``, limits...)."""
        read_fd, write_fd = os.pipe()
        log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "npurt", "serve", "--socket", str(socket_path), "--ready-fd", str(write_fd)]
        for name, path in models.items():
            command += ["--model", f"{name}={path}"]
        command += list(args)
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       pass_fds=(write_fd,), env=None if env is None else {**os.environ, **env})
        finally:
            os.close(write_fd)
        service = cls(process, Path(socket_path), log)
        try:
            ready = b""
            deadline = time.monotonic() + timeout
            while b"READY=1\n" not in ready:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                    service.kill()
                    raise NpuError(f"npurt serve did not get ready within {timeout} s: {service.output()}")
                chunk = os.read(read_fd, 4096)
                if not chunk:  # it exited (or closed the fd) before saying READY
                    process.wait(timeout=10)
                    service._exited()
                    raise NpuError(f"npurt serve exited with status {process.returncode} before it was ready: "
                                   f"{service.output()}")
                ready += chunk
        finally:
            os.close(read_fd)
        for line in ready.decode(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key == "HTTP":
                service.http_address = value
            elif key == "GRPC":
                service.grpc_address = value
        return service

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        """What the service printed so far (its READY line and its log)."""
        if self._log is None:
            return self._text
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _exited(self) -> None:
        """Keep what it printed and close the file (no fd left for the garbage collector to close some time)."""
        if self._log is not None:
            self._text = self.output()
            self._log.close()
            self._log = None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the clean shutdown; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise NpuError(f"npurt serve did not stop within {timeout} s of SIGTERM: {self.output()}") from None
        self._exited()
        return status

    def kill(self) -> None:
        """SIGKILL: no shutdown at all (the socket file stays behind)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self._exited()

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.stop()
        self._exited()
