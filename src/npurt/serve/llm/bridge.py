"""A sequence's events, from the scheduler's thread to the request's coroutine on the HTTP event loop, and a watch
that frees the sequence of a client that went away.

aiohttp does not cancel a handler when its client disconnects (``handler_cancellation`` is off, as the Open
Inference Protocol routes need), and a client waiting for its first token sends and reads nothing: so a task on the
loop looks at every running request's transport every ``WATCH_S`` and cancels the sequence of one that closed (its
cache is free within a scheduler round after that). A write to a gone client's stream fails at once too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

from aiohttp import web

from ..openai.routes import client_gone
from .front import GenerationFront, Prepared
from .scheduler import Event, Sequence

WATCH_S = 0.05
GONE: Event = ("gone",)


class Running:
    """One request's sequence, its events as they come (``batches``).

    Events gather in a list on the scheduler's thread; the loop is woken once for all that came before it looks
    (one ``call_soon_threadsafe`` per batch, not per id: each wakes the loop's thread), and a writer sends a batch in
    one write."""

    def __init__(self, front: GenerationFront, prepared: Prepared, request: web.Request) -> None:
        self.front, self.prepared, self.request = front, prepared, request
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._woken = False  # a wake-up is on its way to the loop
        self._ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        ready = self._ready.set

        def emit(event: Event) -> None:  # on the scheduler's thread
            with self._lock:
                self._pending.append(event)
                if self._woken:
                    return
                self._woken = True
            try:
                loop.call_soon_threadsafe(ready)
            except RuntimeError:  # the loop closed (the server stops): nobody reads it any more
                pass

        self.sequence: Sequence = front.start(prepared, emit)  # ApiError 429 / 503 before anything is sent
        self.over = False  # the sequence ended (its end, error or cancellation is known here)
        self._told = False  # its last event was given out

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The sequence's events, as many as have come at each look, up to and including its end ("end" or
        "error"; "gone": the client went away)."""
        while not self._told:
            await self._ready.wait()
            with self._lock:
                self._ready.clear()
                events, self._pending = self._pending, []
                self._woken = False
            for k, event in enumerate(events):
                if event[0] in ("end", "error", "gone"):
                    self.over = self._told = True
                    del events[k + 1:]
                    break
            yield events

    async def events(self) -> AsyncIterator[Event]:
        """The events one by one (see ``batches``)."""
        async for batch in self.batches():
            for event in batch:
                yield event

    def cancel(self) -> None:
        """Free the sequence (its client is gone, or its handler ends early)."""
        if not self.over:
            self.front.cancel(self.prepared.model.name, self.sequence)
            self.over = True
            with self._lock:
                self._pending.append(GONE)
            self._ready.set()


class Watch:
    """The running requests of one HTTP server, and the task that looks after them."""

    def __init__(self) -> None:
        self.running: set[Running] = set()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watching(self, running: Running) -> Iterator[Running]:
        self.running.add(running)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._look())
        try:
            yield running
        finally:
            self.running.discard(running)
            running.cancel()  # a handler that ended early (a failed write, an exception) frees its sequence

    async def _look(self) -> None:
        while self.running:
            await asyncio.sleep(WATCH_S)
            for r in list(self.running):
                if client_gone(r.request):
                    r.cancel()


__all__ = ["GONE", "Running", "Watch"]
