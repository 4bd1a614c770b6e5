"""Overhead of npurt's OpenVINO runner against calling OpenVINO directly, in one run, on CPU.

For the PP-OCR classifier (1x3x48x192), recogniser (1x3x48x320) and detector (1x3x640x640):

- latency, CPU-configured ports: ``runner.execute`` on runner-allocated (XRT_BO) tensors in the CPU view,
  against ``InferRequest.infer({0: x}, share_inputs=True, share_outputs=True)`` on the runner's own compiled
  model (same model, same compiled settings), the calls taking turns in short blocks so that load from other
  processes hits both alike;
- latency, HW-configured ports (NHWC FP16, converted inside the compiled model): the same, the raw call
  feeding NHWC FP16 arrays to the same HW compiled model;
- throughput: ``execute_async`` keeping ``max_concurrent_runs`` jobs in flight against ``ov.AsyncInferQueue``
  with as many requests, on a THROUGHPUT-hint runner, in alternating blocks.

Targets (issue 4): latency ratio <= 1.03 (and <= 20 us added on the classifier), throughput ratio >= 0.97.

    python benchmarks/openvino_overhead.py [--quick] [--models cls,rec,det]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import openvino as ov

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from measure import alternating, interleaved, keep_in_flight, p50_us, paired_p50_us  # noqa: E402

from models import fetch  # noqa: E402
from npurt import RunnerFactory, StatusCode, TensorDirection, TensorType  # noqa: E402

MODELS = {  # name -> (model, input shape, latency iterations, throughput jobs per block)
    "cls": ("ocr_cls", (1, 3, 48, 192), 2000, 200),
    "rec": ("ocr_rec", (1, 3, 48, 320), 300, 30),
    "det": ("ocr_det", (1, 3, 640, 640), 60, 8),
}


def make_runner(path: Path, shape: tuple[int, ...], **options: object):
    return RunnerFactory.create_runner("OPENVINO", path, {"device": "CPU", "shapes": {"x": list(shape)}, **options})


def tensors(runner, view: TensorType, rng: np.random.Generator):
    ins = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.INPUT, view)]
    outs = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.OUTPUT, view)]
    for t in ins:
        t.numpy()[...] = rng.random(t.info.shape, dtype=np.float32).astype(t.numpy().dtype)
    return ins, outs


def latency(runner, view: TensorType, iterations: int, rng: np.random.Generator
            ) -> tuple[float, float, float, float]:
    """p50s (microseconds) of runner.execute and of the raw infer, taking turns; the p50 of their paired
    differences; and the p50 of runner.execute minus the engine floor (an infer request with the same tensors
    bound once, started with no Python data dispatch): what the runner itself adds per call."""
    ins, outs = tensors(runner, view, rng)
    compiled = runner.engine_for().compiled_model
    request = compiled.create_infer_request()
    raw_inputs = {i: np.array(t.numpy()) for i, t in enumerate(ins)}  # same data, plain numpy arrays
    floor_request = compiled.create_infer_request()
    for port, t in zip(list(compiled.inputs) + list(compiled.outputs), ins + outs):
        floor_request.set_tensor(port, ov.Tensor(t.raw_bytes(), list(t.info.shape), port.get_element_type()))
    infer_base = ov.InferRequest.__mro__[1].infer

    def run_npurt() -> None:
        status = runner.execute([ins], [outs])
        if status is not StatusCode.SUCCESS:
            raise RuntimeError(f"execute: {status.name}: {runner.last_error}")

    def run_raw() -> None:
        request.infer(raw_inputs, share_inputs=True, share_outputs=True)

    def run_floor() -> None:
        infer_base(floor_request, {}, True, True)

    a, b, c = interleaved([run_npurt, run_raw, run_floor], iterations)
    return p50_us(a), p50_us(b), paired_p50_us(a, b), paired_p50_us(a, c)


def throughput(runner, jobs: int, blocks: int, rng: np.random.Generator) -> tuple[float, float, float, int]:
    """Inferences per second: execute_async vs AsyncInferQueue, same number of requests, in alternating blocks.

    Returns the medians of both, and the median of the per-pair ratios (robust to load that drifts between
    pairs of blocks, which the ratio of the two medians is not).
    """
    depth = runner.max_concurrent_runs
    sets = [tensors(runner, TensorType.CPU, rng) for _ in range(depth)]
    queue = ov.AsyncInferQueue(runner.engine_for().compiled_model, depth)
    x = {i: np.array(t.numpy()) for i, t in enumerate(sets[0][0])}

    def run_npurt(n: int) -> float:
        return keep_in_flight(runner, sets, n)

    def run_raw(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            queue.start_async(x, share_inputs=True)
        queue.wait_all()
        return n / (time.perf_counter() - t0)

    a, b, ratio = alternating(run_npurt, run_raw, jobs, blocks)
    return a, b, ratio, depth


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the iterations (a smoke run)")
    parser.add_argument("--models", default="cls,rec,det", help="comma-separated subset of cls,rec,det")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scale = 4 if args.quick else 1
    print(f"OpenVINO {ov.get_version()}, CPU, {'quick' if args.quick else 'full'} run; times are p50 in us")
    print("npurt: runner.execute; raw: InferRequest.infer(share_inputs=True, share_outputs=True); added: p50 of "
          "paired (npurt - raw); vs floor: p50 of (npurt - infer with tensors bound once); async/s: execute_async, "
          "queue/s: AsyncInferQueue, same requests (THROUGHPUT hint); ratio: median of paired block ratios")
    header = (f"{'model':<5} {'ports':<5} {'npurt':>9} {'raw':>9} {'ratio':>6} {'added':>8} {'vs floor':>8}   "
              f"{'async/s':>9} {'queue/s':>9} {'ratio':>6} {'reqs':>4}")
    print(header)
    print("-" * len(header))
    failures = []
    for name in args.models.split(","):
        model, shape, iterations, jobs = MODELS[name]
        path = fetch(model)
        iterations = max(20, iterations // scale)
        jobs = max(8, jobs // scale)
        cpu = make_runner(path, shape, input_tensor_type="CPU", output_tensor_type="CPU")
        hw = make_runner(path, shape)
        tput = make_runner(path, shape, input_tensor_type="CPU", output_tensor_type="CPU",
                           performance_hint="THROUGHPUT")
        rows = []
        for label, runner, view in (("CPU", cpu, TensorType.CPU), ("HW", hw, TensorType.HW)):
            p_npurt, p_raw, added, over_floor = latency(runner, view, iterations, rng)
            ratio = p_npurt / p_raw
            rows.append((label, p_npurt, p_raw, ratio, added, over_floor))
            if ratio > 1.03:
                failures.append(f"{name} {label}-port latency ratio {ratio:.3f} > 1.03")
            if name == "cls" and added > 20:
                failures.append(f"{name} {label}-port adds {added:.1f} us > 20 us")
            if runner.stats["copies"]:
                failures.append(f"{name} {label}: {runner.stats['copies']} host copies on the zero-copy path")
        a, b, tput_ratio, depth = throughput(tput, jobs, 9 if not args.quick else 5, rng)
        if tput_ratio < 0.97:
            failures.append(f"{name} throughput ratio {tput_ratio:.3f} < 0.97")
        for k, (label, p_npurt, p_raw, ratio, added, over_floor) in enumerate(rows):
            tail = f"   {a:9.1f} {b:9.1f} {tput_ratio:6.3f} {depth:4d}" if k == 0 else ""
            print(f"{name:<5} {label:<5} {p_npurt:9.1f} {p_raw:9.1f} {ratio:6.3f} {added:+8.1f} "
                  f"{over_floor:+8.1f}{tail}")
        for r in (cpu, hw, tput):
            r.close()
    print()
    print("targets met" if not failures else "targets missed: " + "; ".join(failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
