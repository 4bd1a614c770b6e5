"""What a process holds: open fds, threads, resident memory (for leak tests)."""

from __future__ import annotations

import os
import threading


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    """Threads other than a runner's pool workers, which start lazily up to the pool's bounded depth."""
    return sum(1 for t in threading.enumerate() if not t.name.startswith("npurt-run"))


def pool_workers() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("npurt-run"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
