"""What an ``npurt serve`` gives its clients (``Limits``) and who a client is (``Peer``, from SO_PEERCRED)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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


__all__ = ["Limits", "Peer", "peer_of"]
