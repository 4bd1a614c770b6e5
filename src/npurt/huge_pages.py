"""Huge pages for a process's memory once an engine has loaded a large model into it (Linux; option
``huge_pages``).

A decoder's step reads every weight once. On 4-KiB pages that walk misses the TLB all the way: SmolLM2-135M int4 on
the CPU provider decoded at 1.15-1.3x the ids/s with its weights on 2-MiB pages, in-process and in the benchmark
(docs/performance.md, section 8; onnxruntime-genai the same when run with glibc's
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``).
Under transparent huge pages' ``madvise`` mode (Debian's and Ubuntu's default) memory is huge only where advised, and
neither engine advises its own (ONNX Runtime's arena and prepacked weights, OpenVINO's plug-in), nor can a process
turn glibc's tunable on once it runs.

So once a model has loaded (``wanted``: by default a decoder of ``MIN_BYTES`` to ``MAX_DEFAULT_BYTES`` on the CPU;
``npurt serve`` asks at any size), the process's anonymous ranges that are nearly all resident are collapsed into huge
pages (``MADV_COLLAPSE``, Linux 6.1+), on a thread of its own: all of them, as a model loaded after another was freed
reuses the memory the first one had. One-shot: no flag stays on the ranges (``MADV_HUGEPAGE`` would leave later
faults and khugepaged filling them, and would lift another library's ``MADV_NOHUGEPAGE``, which the collapse
respects). Collapsing copies (~0.05-0.43 s of one core for SmolLM2 int4, ~1.5-1.8 s for fp32: the kernel's compaction
varies), which the load does not wait for; it begins after the runner's first execute or bound run, or
``START_AT_LATEST_S`` after the load, whichever is first, as the runs beside it wait at times for the pages being
copied. Closing the runner stops it at the next huge page.
Advice only: no value changes. The collapse ignores the THP mode, so under ``never`` nothing is asked (the admin's
choice); on a kernel before 6.1 or another OS the kernel refuses and nothing changes (``Collapse.refused`` says why).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

Ranges = list[tuple[int, int]]  # [start, end) addresses

HUGE_PAGE = 2 << 20
MIN_BYTES = 32 << 20  # a model of fewer bytes: too small for its TLB misses to show
# by default no larger: collapsing SmolLM2 fp32's process (540 MB of weights) took 1.5-1.8 s, and its first 64 ids,
# decoded beside it, came at 0.7x the ids/s (1.1x after); int4's (~120 MB) took 0.05-0.43 s
MAX_DEFAULT_BYTES = 256 << 20
DENSE = 0.875  # a range is collapsed where at least this share of it is resident
# the collapse begins when the runner's first execute or bound run ends (a Generator's first run), or this long after
# the load, whichever comes first (other run paths: runner.run, execute_async, only by this): begun at once, it ran
# beside the Generator's making (its cache's mappings waited: +10-35 ms) and the prompt's run (its weights' pages
# waited: SmolLM2 int4's first token 81-209 ms against 83-97 ms where the compaction took 0.24-0.27 s)
START_AT_LATEST_S = 1.0
_MADV_COLLAPSE = 25
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_HEADER = re.compile(r"[0-9a-f]+-[0-9a-f]+")


def dense_anonymous_ranges() -> Ranges | None:
    """The process's private anonymous writable ranges that are nearly all resident (``dense``), from
    /proc/self/smaps; None where there is no such file (not Linux)."""
    try:
        with open("/proc/self/smaps") as smaps:
            return dense(smaps.readlines())
    except OSError:
        return None


def dense(smaps: list[str]) -> Ranges:
    """The private anonymous writable ranges of an smaps listing (the heap included; not a file's mapping, the
    stack, a named ``[anon:...]`` one or vdso) whose resident share is at least ``DENSE``. A collapse fills a huge
    page's missing small ones: over a sparse range (address space reserved, touched here and there) it would grow
    the memory the process holds."""
    ranges: Ranges = []
    current: tuple[int, int] | None = None
    for line in smaps:
        parts = line.split()
        if not parts:
            continue
        if _HEADER.fullmatch(parts[0]):  # a mapping's first line (field lines start with "Name:")
            current = None
            if len(parts) >= 5 and parts[1][:2] == "rw" and parts[1][3:4] == "p" and \
                    (len(parts) == 5 or parts[5] == "[heap]"):
                start, _, end = parts[0].partition("-")
                current = (int(start, 16), int(end, 16))
        elif parts[0] == "Rss:" and current is not None and len(parts) > 1:
            if int(parts[1]) << 10 >= DENSE * (current[1] - current[0]):
                ranges.append(current)
            current = None
    return ranges


def model_bytes(model_path: Path) -> int:
    """The bytes of a model file and the files beside it that share its stem (its external data, an IR's .bin)."""
    import glob

    try:
        return sum(f.stat().st_size for f in model_path.parent.glob(glob.escape(model_path.stem) + ".*") if f.is_file())
    except OSError:
        return 0


def wanted(asked: bool | None, decoder: bool, model_path: Path, on_cpu: bool) -> bool:
    """Whether to collapse after loading ``model_path``: as option huge_pages ``asked``; by default (None) for a
    decoder (option decoder: a step reads every weight) of MIN_BYTES to MAX_DEFAULT_BYTES whose engine runs on the
    CPU (an NPU's or a GPU's weights are not read through this process's pages)."""
    if asked is not None:
        return asked
    return decoder and on_cpu and MIN_BYTES <= model_bytes(model_path) <= MAX_DEFAULT_BYTES


def _whole_pages(ranges: Ranges) -> Ranges:
    """Each range cut to the huge pages it holds whole (the kernel collapses nothing smaller)."""
    cut = [((lo + HUGE_PAGE - 1) & -HUGE_PAGE, hi & -HUGE_PAGE) for lo, hi in ranges]
    return [(lo, hi) for lo, hi in cut if hi > lo]


@dataclass
class Collapse:
    """The collapse of the process's dense anonymous memory, on a thread of its own: ``done`` is set when it ends;
    then ``collapsed`` bytes of the ``advised`` are on huge pages, in ``seconds`` (``refused``: why the kernel took
    none, or why nothing was asked). ``stop()`` ends it at the next huge page (the runner's close)."""

    advised: int = 0
    collapsed: int = 0
    seconds: float = 0.0
    refused: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Let it begin (the runner's first execute or bound run has ended)."""
        if not self.go.is_set():
            self.go.set()

    def stop(self) -> None:
        self.stopped.set()
        self.go.set()


def collapse_all() -> Collapse:
    """Start collapsing the process's dense anonymous memory (after a load: most of it the engine's; what is huge
    already the kernel passes over). Where no thread can be started, a Collapse refused and done."""
    collapse = Collapse()
    try:
        threading.Thread(target=_collapse, args=(collapse,), name="npurt-huge-pages", daemon=True).start()
    except RuntimeError as e:  # (at interpreter exit, or out of threads)
        collapse.refused = f"no thread to collapse on: {e}"
        collapse.done.set()
    return collapse


def thp_mode() -> str:
    """The kernel's transparent huge pages mode ("always", "madvise", "never"; "" where not told)."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""


def _collapse(collapse: Collapse) -> None:
    collapse.go.wait(START_AT_LATEST_S)
    t0 = time.perf_counter()
    try:
        if collapse.stopped.is_set():
            collapse.refused = "stopped before it began: the runner closed"
            return
        if thp_mode() == "never":
            collapse.refused = "transparent huge pages are 'never' on this machine: nothing asked"
            return
        ranges = dense_anonymous_ranges()
        if ranges is None:
            collapse.refused = "no /proc/self/smaps to read (not Linux)"
            return
        pages = _whole_pages(ranges)
        collapse.advised = sum(hi - lo for lo, hi in pages)
        libc = ctypes.CDLL(None, use_errno=True)  # (the calls release the GIL)
        madvise = libc.madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        reasons = set()
        for lo, hi in pages:
            # a huge page at a time: the engine's reads of the page being copied wait for that page only, and a
            # close stops it (a range freed since and mapped again sparse would be filled)
            for at in range(lo, hi, HUGE_PAGE):
                if collapse.stopped.is_set():
                    reasons.add("stopped: the runner closed")
                    break
                if madvise(at, HUGE_PAGE, _MADV_COLLAPSE) == 0:
                    collapse.collapsed += HUGE_PAGE
                    continue
                code = ctypes.get_errno()
                reasons.add(_reason(code))
                if code == errno.EINVAL:  # the range is marked not to be huge, or the kernel has no MADV_COLLAPSE
                    break
        if not collapse.collapsed:
            collapse.refused = "; ".join(sorted(reasons)) or "nothing to collapse"
    except Exception as e:  # noqa: BLE001 - advice only: told in ``refused``, never raised on a daemon thread
        collapse.refused = f"{type(e).__name__}: {e}"
    finally:
        collapse.seconds = time.perf_counter() - t0
        collapse.done.set()


def _reason(code: int) -> str:
    if code == errno.EINVAL:
        return ("MADV_COLLAPSE refused: memory marked MADV_NOHUGEPAGE, huge pages disabled for this process, or a "
                "kernel before 6.1")
    return f"MADV_COLLAPSE: {os.strerror(code)}"


__all__ = ["DENSE", "START_AT_LATEST_S", "MAX_DEFAULT_BYTES", "MIN_BYTES", "Collapse", "collapse_all", "dense",
           "dense_anonymous_ranges", "model_bytes", "thp_mode", "wanted"]
