"""Measurements in a fresh Python process: start-up figures as a user's program sees them, memory included.

``in_fresh_process(target, **kwargs)`` starts ``python``, imports the target, calls ``target(probe, **kwargs)``
and reports what it returned (a JSON-able dict) with the process's memory: VmRSS once the imports were done (the
target calls ``probe.baseline()`` after its own imports; by default the baseline is taken right after importing the
target's module), VmRSS at the end minus that, and the peak growth over it (the child resets its peak, VmHWM,
at the baseline). A target may keep objects alive until the end with ``probe.keep(obj)``.

A target is a function given as itself or as ``"module:function"`` or ``"path/to/file.py:function"``. A function
is loaded from its file without importing its package, so that the package's imports are not made before the
clock starts; its module must then import only the standard library at its top (``npurt.bench.loads`` does).
The child runs in the current directory, so ``"benchmarks.x:f"`` works from the repository root.

    >>> from npurt.bench import loads
    >>> from npurt.bench.fresh import fresh_loads
    >>> fresh_loads([(loads.load_onnxruntime, {"model": "m.onnx", "inputs": {"x": [[1, 3, 8, 8], "float32"]}})],
    ...             runs=3)[0].rss_added_mib
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .measure import NO_PROGRESS, BenchError, Progress
from .results import FreshLoad, FreshRun

MARKER = "NPURT_FRESH_RESULT "

# The child: standard library only, so that nothing but the target's own imports runs before the baseline.
_BOOTSTRAP = r"""
import time
_t0 = time.perf_counter()
import importlib, importlib.util, json, sys

def _status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out

def _first_cpu():
    # Every load starts on the machine's first CPU, then may go anywhere again. Where the imports leave the main
    # thread is chance (numpy's BLAS thread spins on one core while they run, so the main thread ends on the other),
    # and engines pin their first worker thread to the second core, assuming the caller on the first: a caller
    # left there shares a core with a spinning worker until the kernel moves it (~8 ms on a 2-core VM), on either
    # side of a comparison, whichever imported in the order that puts it there.
    import os
    if hasattr(os, "sched_setaffinity"):
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})
        os.sched_setaffinity(0, allowed)

class Probe:
    def __init__(self):
        self.kept = []
        self.baseline()

    def baseline(self):
        self.import_ms = (time.perf_counter() - _t0) * 1e3
        _first_cpu()
        try:  # "5" resets the peak RSS (VmHWM) to the current RSS
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.exact = True
        except OSError:
            self.exact = False
        self.rss = _status()["VmRSS"]

    def keep(self, obj):
        self.kept.append(obj)
        return obj

spec = json.loads(sys.argv[1])
where, _, name = spec["target"].rpartition(":")
if where.endswith(".py"):
    module_spec = importlib.util.spec_from_file_location("_npurt_fresh_target", where)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
else:
    module = importlib.import_module(where)
probe = Probe()
value = getattr(module, name)(probe, **spec["kwargs"])
end = _status()
print("%s%s" % (spec["marker"], json.dumps({
    "value": value, "import_ms": probe.import_ms, "rss_after_imports_mib": probe.rss,
    "rss_added_mib": end["VmRSS"] - probe.rss, "peak_added_mib": end["VmHWM"] - probe.rss,
    "peak_exact": probe.exact})), flush=True)
"""

Target = Callable[..., dict[str, Any]] | str


def target_name(target: Target) -> str:
    """``"file.py:function"`` for a function, the string itself otherwise."""
    if isinstance(target, str):
        return target
    return f"{inspect.getfile(target)}:{target.__name__}"


def in_fresh_process(target: Target, timeout_s: float = 600, **kwargs: Any) -> FreshRun:
    """Run ``target(probe, **kwargs)`` in a fresh Python process (see the module's docstring)."""
    name = target_name(target)
    spec = {"target": name, "kwargs": kwargs, "marker": MARKER}
    proc = subprocess.run([sys.executable, "-c", _BOOTSTRAP, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit status {proc.returncode}"
        raise BenchError(f"{name.rpartition(':')[2]} in a fresh process failed: {tail}")
    data = json.loads(lines[-1][len(MARKER):])
    return FreshRun(**data)


def fresh_loads(targets: Sequence[tuple[Target, dict[str, Any]]], runs: int, fill_first: bool = False,
                progress: Progress = NO_PROGRESS, label: str = "fresh-process loads") -> list[FreshLoad]:
    """Each target ``runs`` times, in rounds that take turns (so that other load hits all alike); the median of
    each. A target returns at least ``load_ms`` and ``first_inference_ms`` (``npurt.bench.loads`` has them).
    ``fill_first``: one untimed run of each first (to fill a compiled-model cache)."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    progress.phase(label)
    if fill_first:
        for target, kwargs in targets:
            in_fresh_process(target, **kwargs)
    results: list[list[FreshRun]] = [[] for _ in targets]
    for k in range(runs):
        order = list(range(len(targets)))
        if k % 2:
            order.reverse()
        for i in order:
            target, kwargs = targets[i]
            results[i].append(in_fresh_process(target, **kwargs))
        progress.update((k + 1) / runs)
    progress.done()
    return [FreshLoad.from_runs(r) for r in results]


__all__ = ["MARKER", "fresh_loads", "in_fresh_process", "target_name"]
