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


def announce_ready(socket_path: str, ready_fd: int | None, models: list[str], http: str = "", grpc: str = "") -> None:
    """The service listens and its models are compiled: say so on stdout, on ``ready_fd`` and to systemd. ``http``,
    ``grpc``: the Open Inference Protocol's addresses where it listens (ports chosen by the system included)."""
    listening = "".join(f" {kind} {address}" for kind, address in (("HTTP", http), ("GRPC", grpc)) if address)
    print(f"READY {socket_path}{listening}", flush=True)
    if ready_fd is not None:
        lines = f"SOCKET={socket_path}\nPID={os.getpid()}\n" + (f"HTTP={http}\n" if http else "") + (
            f"GRPC={grpc}\n" if grpc else "")
        try:
            # READY=1 last: a reader that has it has the whole message
            os.write(ready_fd, (lines + "READY=1\n").encode())
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
