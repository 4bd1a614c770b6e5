"""One kind of model served over OpenAI's API (``--generate``, ``--embed``, ``--transcribe``), as the server sees
it: loaded at start, its routes on the ``--http`` listener, drained and closed at the end.

``ModelKind`` is what the command line gives the server (the flag, the named folders and how to load them);
``ServedKind`` what loading gives back. The server knows nothing else of a kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client import CollectorRegistry


class ServedKind(Protocol):
    """The loaded models of one kind."""

    def model_docs(self) -> list[dict[str, Any]]:
        """Each model's entry in ``GET /v1/models`` (OpenAI's model object, with what this kind adds)."""

    def add_routes(self, app: web.Application) -> None:
        """Add this kind's routes (not ``/v1/models``: the server lists every kind's there)."""

    def refuse_new(self, why: str) -> None:
        """From now on new requests are answered 503 with ``why``; those in flight go on."""

    def drain(self, deadline: float) -> bool:
        """Let the requests in flight end until ``deadline`` (``time.monotonic()``); False: some still run."""

    def close(self, why: str) -> None:
        """End what still runs with an error saying ``why``; release the runners."""

    @property
    def active(self) -> int:
        """Requests running or queued."""


@dataclass(frozen=True)
class ModelKind:
    """A kind of model the command line asks to serve: its flag, its folders by name, and ``load`` (the backend name,
    e.g. AUTO, and the server's metrics registry where it has one -> the loaded kind; runs at start, before
    READY)."""

    flag: str
    folders: Mapping[str, Path]
    load: Callable[[str, CollectorRegistry | None], ServedKind]
    what: str = "models"  # said in errors: "language models", "embedding models"...

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.folders)


__all__ = ["ModelKind", "ServedKind"]
