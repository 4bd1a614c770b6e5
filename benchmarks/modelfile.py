"""npurt.modelfile.read_onnx_ports against onnx.load(..., load_external_data=False): time and peak memory.

Each reader runs in its own fresh process (so one's peak RSS does not hide the other's) with both modules imported
first; the process reports its peak RSS growth over that baseline for one read (ru_maxrss: resident pages, file-backed
mmap pages included), the first read's time (the file in the page cache, not yet mapped by this process) and the best
and median of the following reads.

    python benchmarks/modelfile.py [MODEL.onnx ...] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_MODELS = ("ch_PP-OCRv4_rec_infer.onnx", "ch_PP-OCRv4_det_infer.onnx")
CACHE = Path.home() / ".cache" / "npurt" / "models"

CHILD = r"""
import json, resource, sys, time
import onnx
from npurt.modelfile import read_onnx_ports
path, reader, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
read = read_onnx_ports if reader == "npurt" else (lambda p: onnx.load(p, load_external_data=False))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter(); result = read(path); first = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
del result
times = []
for _ in range(repeat):
    t = time.perf_counter(); read(path); times.append(time.perf_counter() - t)
print(json.dumps({"first": first, "times": times, "peak_kib": peak - base}))
"""


def measure(path: Path, reader: str, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), reader, str(repeat)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    models = args.models or [CACHE / name for name in DEFAULT_MODELS]
    print(f"{'model':32} {'reader':10} {'first ms':>9} {'best ms':>8} {'median ms':>10} {'peak RSS +MiB':>14}")
    for path in models:
        size = path.stat().st_size / 2**20
        for reader in ("npurt", "onnx.load"):
            r = measure(path, reader, args.repeat)
            print(f"{path.name[:32]:32} {reader:10} {r['first'] * 1e3:9.2f} {min(r['times']) * 1e3:8.2f} "
                  f"{statistics.median(r['times']) * 1e3:10.2f} {r['peak_kib'] / 1024:14.1f}")
        print(f"{'':32} (file {size:.1f} MiB)")


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.1f} s)")
