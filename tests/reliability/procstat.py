"""What a process holds: open fds, threads, resident memory (for leak tests)."""

from __future__ import annotations

import os
import threading


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return threading.active_count()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
