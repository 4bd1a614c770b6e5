"""Overhead of npurt's VAIML runner (ONNX Runtime) against calling ONNX Runtime directly, in one run, on CPU.

For the PP-OCR classifier (1x3x48x192), recogniser (1x3x48x320) and detector (1x3x640x640):

- latency, CPU-configured ports: ``runner.execute`` on runner-allocated tensors in the CPU view, against
  ``InferenceSession.run(None, {"x": x})`` on the original model (a session with default options, as a user
  would make it), the calls in short alternating blocks so that load from other processes hits both alike;
- latency, HW-configured ports (HCWNC4 BF16, converted inside the session's graph): the same, against the
  same ``InferenceSession.run`` on the original model; the column "graph" is the runner's own edited
  session driven by a bare IOBinding, which splits the difference into the conversion nodes baked into
  the graph (graph - raw) and npurt's Python path (npurt - graph);
- throughput: ``execute_async`` keeping ``max_concurrent_runs`` jobs in flight against a plain
  ``ThreadPoolExecutor`` with as many workers calling ``InferenceSession.run``, in alternating blocks.

Targets (issue 5): latency ratio <= 1.03 per model for CPU ports (and for HW ports, or an explanation of
where the time goes), throughput ratio >= 0.97.

    python benchmarks/vaiml_overhead.py [--quick] [--models cls,rec,det]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from measure import alternating, interleaved, keep_in_flight, p50_us  # noqa: E402

from models import fetch  # noqa: E402
from npurt import DataType, NpuTensor, RunnerFactory, StatusCode, TensorDirection, TensorType, convert  # noqa: E402

MODELS = {  # name -> (model, input shape, latency iterations, throughput jobs per block)
    "cls": ("ocr_cls", (1, 3, 48, 192), 2000, 400),
    "rec": ("ocr_rec", (1, 3, 48, 320), 200, 60),
    "det": ("ocr_det", (1, 3, 640, 640), 30, 10),
}


def make_runner(path: Path, shape: tuple[int, ...], **options: object):
    return RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "shapes": {"x": list(shape)}, **options})


def tensors(runner, view: TensorType, x: np.ndarray):
    ins = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.INPUT, view)]
    outs = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.OUTPUT, view)]
    cpu_info = runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0]
    convert(NpuTensor(cpu_info, x), ins[0])  # the same data in the view the port takes
    return ins, outs


def latency(runner, view: TensorType, raw: ort.InferenceSession, x: np.ndarray, iterations: int
            ) -> tuple[float, float, float]:
    """p50 of runner.execute, of raw InferenceSession.run on the original model, and of the runner's own
    session driven by a bare IOBinding (microseconds)."""
    ins, outs = tensors(runner, view, x)
    feeds = {"x": x}
    session = runner.engine_for().session
    binding = session.io_binding()
    for t in ins:
        binding.bind_input(t.info.name, "cpu", 0, _etype(t), list(t.info.shape), t.get_virtual_address())
    for t in outs:
        binding.bind_output(t.info.name, "cpu", 0, _etype(t), list(t.info.shape), t.get_virtual_address())

    def run_npurt() -> None:
        status = runner.execute([ins], [outs])
        if status is not StatusCode.SUCCESS:
            raise RuntimeError(f"execute: {status.name}: {runner.last_error}")

    def run_raw() -> None:
        raw.run(None, feeds)

    def run_graph() -> None:
        session.run_with_iobinding(binding)

    return tuple(p50_us(t) for t in interleaved([run_npurt, run_raw, run_graph], iterations))  # type: ignore


def _etype(t) -> int:
    """The ONNX element type to bind (bfloat16 as the int 16: numpy has no bfloat16)."""
    if t.info.data_type is DataType.BF16:
        return onnx.TensorProto.BFLOAT16
    return onnx.helper.np_dtype_to_tensor_dtype(t.info.numpy_dtype)


def throughput(runner, raw: ort.InferenceSession, x: np.ndarray, jobs: int, blocks: int
               ) -> tuple[float, float, float, int]:
    """Inferences per second: execute_async vs a thread pool calling run, same concurrency, alternating blocks.

    Returns the medians of both, and the median of the per-pair ratios (measure.alternating).
    """
    depth = runner.max_concurrent_runs
    sets = [tensors(runner, TensorType.CPU, x) for _ in range(depth)]
    pool = ThreadPoolExecutor(max_workers=depth)
    feeds = {"x": x}

    def run_npurt(n: int) -> float:
        return keep_in_flight(runner, sets, n)

    def run_raw(n: int) -> float:
        t0 = time.perf_counter()
        futures: deque = deque()
        for _ in range(n):
            if len(futures) >= depth:  # the same number in flight as npurt keeps
                futures.popleft().result()
            futures.append(pool.submit(raw.run, None, feeds))
        wait(futures)
        for f in futures:
            f.result()
        return n / (time.perf_counter() - t0)

    a, b, ratio = alternating(run_npurt, run_raw, jobs, blocks)
    pool.shutdown()
    return a, b, ratio, depth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the iterations (a smoke run)")
    parser.add_argument("--models", default="cls,rec,det", help="comma-separated subset of cls,rec,det")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scale = 4 if args.quick else 1
    print(f"ONNX Runtime {ort.__version__}, CPUExecutionProvider, {'quick' if args.quick else 'full'} run; "
          "times are p50 in us")
    print("npurt: runner.execute; raw run: InferenceSession.run on the original model; graph: the runner's session "
          "through a bare IOBinding; async/s: execute_async, pool/s: threads calling run, same concurrency; "
          "throughput ratio: median of paired block ratios")
    header = (f"{'model':<5} {'ports':<5} {'npurt':>9} {'raw run':>9} {'ratio':>6} {'graph':>9}   "
              f"{'async/s':>8} {'pool/s':>8} {'ratio':>6} {'reqs':>4}")
    print(header)
    print("-" * len(header))
    failures = []
    for name in args.models.split(","):
        model, shape, iterations, jobs = MODELS[name]
        path = fetch(model)
        iterations = max(12, iterations // scale)
        jobs = max(6, jobs // scale)
        x = rng.random(shape, dtype=np.float32)
        raw = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        cpu = make_runner(path, shape, input_tensor_type="CPU", output_tensor_type="CPU")
        hw = make_runner(path, shape)
        rows = []
        for label, runner, view in (("CPU", cpu, TensorType.CPU), ("HW", hw, TensorType.HW)):
            p_npurt, p_raw, p_graph = latency(runner, view, raw, x, iterations)
            ratio = p_npurt / p_raw
            rows.append((label, p_npurt, p_raw, ratio, p_graph))
            if ratio > 1.03:
                failures.append(f"{name} {label}-port latency ratio {ratio:.3f} > 1.03")
            if runner.stats["copies"]:
                failures.append(f"{name} {label}: {runner.stats['copies']} host copies on the zero-copy path")
        a, b, tput_ratio, depth = throughput(cpu, raw, x, jobs, 9 if not args.quick else 5)
        if tput_ratio < 0.97:
            failures.append(f"{name} throughput ratio {tput_ratio:.3f} < 0.97")
        for k, (label, p_npurt, p_raw, ratio, p_graph) in enumerate(rows):
            tail = f"   {a:8.1f} {b:8.1f} {tput_ratio:6.3f} {depth:4d}" if k == 0 else ""
            print(f"{name:<5} {label:<5} {p_npurt:9.1f} {p_raw:9.1f} {ratio:6.3f} {p_graph:9.1f}{tail}")
        for r in (cpu, hw):
            r.close()
    print()
    print("targets met" if not failures else "targets missed: " + "; ".join(failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
