"""npurt.modelfile.read_onnx_ports against onnx.load(..., load_external_data=False): time and peak memory.

Each reader runs in its own fresh process (``npurt.bench.in_fresh_process``: so that one's peak RSS does not hide
the other's). After the baseline the process imports the reader's module and reads the model once: the import is
part of the first read's time and memory, since not paying for ``import onnx`` on a runner's load path is what the
hand-written reader is for (``npurt.modelfile`` is part of npurt, which the measuring process has imported already,
so its import costs nothing more there, as in an app). The process reports the peak RSS growth over the baseline
(VmHWM, reset at the baseline; resident pages, file-backed mmap pages included), the import's and the first read's
time (the file in the page cache, not yet mapped by this process) and the best and median of the following reads
(``npurt.bench.measure_latency``).

Targets (the modelfile issue: a runner's load must not pay for parsing weights it does not need; no figures were
stated there, these are this script's), per model: read_onnx_ports's peak memory growth at most half of onnx.load's,
and its import and first read no slower than onnx.load's. The repeated reads are reported only: once the file is mapped,
protobuf's C++ parser is as fast as this pure-Python walk.

    python -m benchmarks.modelfile [MODEL.onnx ...] [--repeat N] [--quick] [--json]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import finish, parser
from npurt.bench import Report, Table, Target, in_fresh_process
from npurt.models import zoo

DEFAULT_MODELS = ("ocr_rec", "ocr_det")
TIME_LIMIT, MEMORY_LIMIT = 1.0, 0.5


def read_ports(probe: Any, path: str, reader: str, repeat: int) -> dict[str, Any]:
    """In the fresh process: the reader's module imported and one read (memory and time, the import included: not
    paying for ``import onnx`` is half the point of npurt's reader), then ``repeat`` reads (times)."""
    import importlib

    from npurt.bench import Budget, CallSubject, measure_latency

    probe.baseline()
    t0 = time.perf_counter()
    module = importlib.import_module("npurt.modelfile" if reader == "npurt" else "onnx")
    imported = time.perf_counter()
    read = module.read_onnx_ports if reader == "npurt" else (lambda p: module.load(p, load_external_data=False))
    result = read(path)
    done = time.perf_counter()
    del result
    (times,) = measure_latency([CallSubject(reader, lambda: read(path))],
                               Budget(niter=repeat, time_s=None, warmup=0, blocks=1, settle=0))
    return {"import_ms": (imported - t0) * 1e3, "first_ms": (done - t0) * 1e3, "best_ms": times.min_ms,
            "median_ms": times.p50_ms}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("models", nargs="*", type=Path)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    repeat = 5 if args.quick else args.repeat
    models = args.models or [zoo.path(name) for name in DEFAULT_MODELS]
    report = Report(f"reading an ONNX model's ports, each reader in a fresh process ({repeat} reads after the first)")
    table = Table(["model", "MiB", "reader", "import ms", "first ms (import included)", "best ms", "median ms",
                   "peak RSS +MiB"], formats=["", "{:.1f}", "", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.1f}"])
    report.tables.append(table)
    for path in models:
        size = path.stat().st_size / 2**20
        runs = {reader: in_fresh_process(read_ports, path=str(path), reader=reader, repeat=repeat)
                for reader in ("npurt", "onnx.load")}
        for reader, run in runs.items():
            table.add(path.name, size, reader, run.value["import_ms"], run.value["first_ms"], run.value["best_ms"],
                      run.value["median_ms"], run.peak_added_mib)
        ours, theirs = runs["npurt"], runs["onnx.load"]
        report.targets.append(Target(f"{path.name}: import and first read, npurt / onnx.load",
                                     ours.value["first_ms"] / theirs.value["first_ms"], TIME_LIMIT))
        report.targets.append(Target(f"{path.name}: peak memory growth, npurt / onnx.load",
                                     ours.peak_added_mib / max(theirs.peak_added_mib, 1e-3), MEMORY_LIMIT))
        if not ours.peak_exact:
            report.notes.append("the kernel did not let the child reset its peak RSS: peaks are bounds from above")
    return finish(report, args.json)


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.1f} s)")
    sys.exit(code)
