"""What npurt does at interpreter exit.

Runners still open are closed: no new run starts, jobs end, worker threads are joined. Then the exit waits (up to
``EXIT_DRAIN_S``) for the app's own threads that are inside an engine call to leave it: a daemon thread still in
the engine's C++ when the interpreter finalizes is unwound by ``pthread_exit`` through C++ frames, which aborts the
process ("terminate called without an active exception"; the raw engines do the same). A thread is inside an
engine call while its stack holds a frame of ``npurt.backends`` (which only adapts engines) or of a method of any
other ``Engine`` or ``Backend`` subclass (a backend registered from outside npurt): found by looking at the threads'
frames at exit, so that no run pays for counting itself."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from types import CodeType
from typing import Protocol

from .engine import Backend, Engine
from .logs import LOGGER

EXIT_DRAIN_S = 5.0  # the longest the exit waits for runs in progress on other threads
QUIET_S = 0.01
_BACKENDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends") + os.sep


class ExitLog(Protocol):
    def exception(self, msg: str, *args: object) -> None: ...


class OpenRunner(Protocol):
    @property
    def log(self) -> ExitLog: ...

    def close(self) -> None: ...


open_runners: weakref.WeakSet[OpenRunner] = weakref.WeakSet()  # runners register here until they close


def _close_open_runners() -> None:
    for runner in list(open_runners):
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            runner.log.exception("closing %r at exit", runner)


def _engine_methods() -> set[CodeType]:
    """The code of every method of the Engine and Backend subclasses loaded (npurt's own and registered ones)."""
    codes: set[CodeType] = set()
    classes: list[type] = [Engine, Backend]
    while classes:
        sub: type
        for sub in classes.pop().__subclasses__():
            classes.append(sub)
            for value in vars(sub).values():
                code = getattr(getattr(value, "__func__", value), "__code__", None)  # (static and class methods)
                if isinstance(code, CodeType):
                    codes.add(code)
    return codes


def threads_in_engines() -> list[str]:
    """The names of the threads (this one aside) that are inside an engine call now."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    methods = _engine_methods()
    inside = []
    for ident, frame in sys._current_frames().items():
        f = frame if ident != me else None
        while f is not None:
            if f.f_code in methods or f.f_code.co_filename.startswith(_BACKENDS):
                inside.append(names.get(ident, str(ident)))
                break
            f = f.f_back
    return inside


@atexit.register
def _at_exit() -> None:
    _close_open_runners()
    if threading.active_count() == 1:  # (no other Python thread: nothing to wait for)
        return
    # quiet twice, QUIET_S apart: a thread that passed its runner's closed check just before close() enters the
    # engine within microseconds
    deadline = time.monotonic() + EXIT_DRAIN_S
    quiet, inside = 0, []
    while quiet < 2 and time.monotonic() < deadline:
        _close_open_runners()  # one that a thread finished loading meanwhile
        inside = threads_in_engines()
        quiet = 0 if inside else quiet + 1
        time.sleep(QUIET_S)
    if inside:
        LOGGER.warning("exiting while threads are inside an engine call after %.0f s: %s", EXIT_DRAIN_S,
                       ", ".join(inside))
