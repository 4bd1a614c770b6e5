"""benchmarks/batch_steps.py in its --quick mode (issue 57 item 10: measured through npurt.bench): its report has a
row per decoder and backend with every figure, a target per row, and no wrong ids. A missed speed target is the
script's verdict (exit 1), not a test failure: this machine is shared and small."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_batch_steps_quick() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NPURT_NUM_THREADS"}  # (the script states its threads)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.batch_steps", "--quick", "--json",
                           "--shapes", "gqa,bench-builder:int4", "--backends", "ONNXRUNTIME,VAIML"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    rows = report["tables"][0]["rows"]
    assert [row[:2] for row in rows] == [["gqa", "ONNXRUNTIME"], ["gqa", "VAIML"],
                                        ["bench-builder:int4", "ONNXRUNTIME"], ["bench-builder:int4", "VAIML"]]
    for row in rows:  # B=1, 2, 4, 8 tok/s, B=8 / B=1, Generator tok/s, B=1 / Generator
        assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in row[2:]), row
    assert [t["what"] for t in report["targets"]] == [
        "gqa ONNXRUNTIME: B=8 / B=1 aggregate tokens/s", "gqa VAIML: B=8 / B=1 aggregate tokens/s",
        "bench-builder:int4 ONNXRUNTIME: B=2 / B=1 aggregate tokens/s",
        "bench-builder:int4 VAIML: B=2 / B=1 aggregate tokens/s"]
    assert all(math.isfinite(t["value"]) and t["value"] > 0 for t in report["targets"])
    assert not report["problems"]  # row 0's ids in every fp32 batch are its ids alone
    assert (proc.returncode == 1) == bool(report["missed"])
