"""What a process holds: open fds, threads, resident memory (for leak tests)."""

from __future__ import annotations

import gc
import os
import threading
import time


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_targets(fds: list[int]) -> set[str]:
    """What the fds refer to (``/proc/self/fd`` links: "memfd:...", "pipe:[...]", a path), for ``leaked_fds``."""
    out = set()
    for fd in fds:
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # not an open fd
            pass
    return out


def leaked_fds(before: set[str], targets: set[str]) -> list[str]:
    """Fds opened since ``before`` (a set of fd numbers) that refer to one of ``targets``: what the code under test
    left open of the objects it was given. Fds other threads open or close meanwhile (a collected object of an
    earlier test, an engine's file) refer to other things and do not count; a comparison of counts would."""
    leaked = []
    for n in set(os.listdir("/proc/self/fd")) - before:
        try:
            if os.readlink(f"/proc/self/fd/{n}") in targets:
                leaked.append(n)
        except OSError:  # closed meanwhile
            pass
    return leaked


def fd_set() -> set[str]:
    """The numbers of the process's open fds."""
    return set(os.listdir("/proc/self/fd"))


def settled_fds(expected: int, seconds: float = 2.0) -> int:
    """The open-fd count once it equals ``expected`` or ``seconds`` have passed: fds that other threads or
    the garbage collector are closing at this moment are not leaks."""
    deadline = time.monotonic() + seconds
    while (n := open_fds()) != expected and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return n


def threads() -> int:
    """Threads other than a runner's pool workers, which start lazily up to the pool's bounded depth."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith("npurt-run"))


def pool_workers() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("npurt-run"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
