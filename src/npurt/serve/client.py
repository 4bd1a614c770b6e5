"""The client side of ``npurt serve``: ``npurt.connect()`` gives a ``ServiceClient``, one connection to a service
shared by every runner opened through it.

``client.open_runner(name)`` gives an ordinary ``npurt.Runner`` built over ``RemoteBackend`` (``npurt.serve.remote``),
so validation, plans, jobs, ``wait`` / ``wait_any``, callbacks, InferQueue and streams are the local runner's own:
only the engine is remote. The layers, each importing only those below it: ``connection`` (the socket, requests and
replies), ``remote`` (a Runner's engine over a connection), this module (a connection that opens runners).

When the connection is lost (the service stopped, restarted or was killed) every run waiting on it, and every later
one, ends with FAILURE and a message saying so; requests that are queries raise NpuError. Nothing waits forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..options import parse_options
from ..runner import Runner
from . import protocol as p
from .connection import CONNECT_TIMEOUT_S, Connection, Reply
from .remote import RemoteBackend


class ServiceClient(Connection):
    """A connection to an ``npurt serve`` that opens runners of its models; thread-safe, shared by every runner
    opened through it (close those first)."""

    def __init__(self, socket_path: str | Path | None = None, timeout: float = CONNECT_TIMEOUT_S) -> None:
        super().__init__(socket_path, timeout)
        # A Runner makes its backend from a class: this connection's runners get a RemoteBackend class bound to it.
        self.backend_class = RemoteBackend.over(self)

    def models(self) -> list[dict[str, Any]]:
        """What the service serves: each model's name, its options, and the runners loaded for it."""
        return list(self.call(p.MODELS).doc.get("models", []))

    def stats(self) -> dict[str, Any]:
        """The service's view of this connection (jobs, registered memory) and of itself (clients, queue)."""
        return dict(self.call(p.STATS).doc)

    def open_runner(self, model: str, options: Mapping[str, Any] | None = None) -> Runner:
        """A Runner of the service's model ``model``. Options: a runner's; those the client keeps (its job table,
        batch size, memory, carried state) apply here, the others choose what the service compiles (options left
        at their defaults take the service's settings for the model, e.g. its pinned shapes)."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"a served model is named by a string, got {model!r}")
        parsed = parse_options(options)
        served = p.served_options(parsed, options or {})
        effective = self.call(p.DESCRIBE, {"model": model, "options": served}).doc.get("options", {})
        return Runner(self.backend_class, model, {**p.client_options(options), **effective})


def connect(socket: str | Path | None = None, timeout: float = CONNECT_TIMEOUT_S) -> ServiceClient:
    """Connect to an ``npurt serve`` (default socket: ``$NPURT_SERVICE``, else ``$XDG_RUNTIME_DIR/npurt/serve.sock``).

    NpuError when no service listens there, or it refuses this process (its uid, or a limit: the message says)."""
    return ServiceClient.open(socket, timeout)


__all__ = ["Reply", "ServiceClient", "connect"]
