"""What npurt does at interpreter exit.

Runners still open are closed: no new run starts, jobs end, worker threads are joined. Then the exit waits (up to
``EXIT_DRAIN_S``) for the app's own threads that are inside an engine call to leave it: a daemon thread still in
the engine's C++ when the interpreter finalizes is unwound by ``pthread_exit`` through C++ frames, which aborts the
process ("terminate called without an active exception"; the raw engines do the same). A thread is inside an
engine call while a frame of ``npurt.backends`` (which only adapts engines) is on its stack: found by looking at
the threads' frames once, at exit, so that no run pays for counting itself."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from typing import Protocol

EXIT_DRAIN_S = 5.0  # the longest the exit waits for runs in progress on other threads
QUIET_S = 0.01
_BACKENDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends") + os.sep

log = logging.getLogger("npurt")


class Closable(Protocol):
    def close(self) -> None: ...


open_runners: weakref.WeakSet[Closable] = weakref.WeakSet()  # runners register here until they close


def threads_in_engines() -> list[str]:
    """The names of the threads (this one aside) that are inside an engine call now."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    inside = []
    for ident, frame in sys._current_frames().items():
        f = frame if ident != me else None
        while f is not None:
            if f.f_code.co_filename.startswith(_BACKENDS):
                inside.append(names.get(ident, str(ident)))
                break
            f = f.f_back
    return inside


@atexit.register
def _at_exit() -> None:
    for runner in list(open_runners):
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            log.exception("closing %r at exit", runner)
    if threading.active_count() == 1:  # (no other Python thread: nothing to wait for)
        return
    # quiet twice, QUIET_S apart: a thread that passed its runner's closed check just before close() enters the
    # engine within microseconds
    deadline = time.monotonic() + EXIT_DRAIN_S
    quiet, inside = 0, []
    while quiet < 2 and time.monotonic() < deadline:
        inside = threads_in_engines()
        quiet = 0 if inside else quiet + 1
        time.sleep(QUIET_S)
    if inside:
        log.warning("exiting while threads are inside an engine call after %.0f s: %s", EXIT_DRAIN_S,
                    ", ".join(inside))
