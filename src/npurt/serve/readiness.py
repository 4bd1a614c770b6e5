"""Telling scripts and service managers that ``npurt serve`` is ready (or stopping).

Three ways, all optional: a ``READY <socket>`` line on stdout, a message written to an inherited fd
(``--ready-fd``, closed after), and systemd's notification socket (``$NOTIFY_SOCKET``, ``Type=notify`` units).
"""

from __future__ import annotations

import os
import socket
import sys


def sd_notify(state: str) -> bool:
    """Send ``state`` (e.g. "READY=1") to ``$NOTIFY_SOCKET``; False where there is none or it cannot be reached."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(state.encode())
        return True
    except OSError:
        return False


def announce_ready(socket_path: str, ready_fd: int | None, models: list[str]) -> None:
    """The service listens and its models are compiled: say so on stdout, on ``ready_fd`` and to systemd."""
    print(f"READY {socket_path}", flush=True)
    if ready_fd is not None:
        try:
            os.write(ready_fd, f"READY=1\nSOCKET={socket_path}\nPID={os.getpid()}\n".encode())
        except OSError as e:
            print(f"npurt serve: cannot write to --ready-fd {ready_fd}: {e.strerror}", file=sys.stderr)
        finally:
            try:
                os.close(ready_fd)
            except OSError:
                pass
    sd_notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving {', '.join(models)} on {socket_path}")


def announce_stopping(reason: str) -> None:
    sd_notify(f"STOPPING=1\nSTATUS=stopping: {reason}")
