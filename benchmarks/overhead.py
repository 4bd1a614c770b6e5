"""Overhead of npurt's runner against its engine called directly, on CPU, in one run: --backend openvino or vaiml.

For the PP-OCR classifier (1x3x48x192), recogniser (1x3x48x320) and detector (1x3x640x640), at those static shapes:

- latency, CPU views (the model's own): ``runner.execute`` on runner-allocated tensors, against
  - raw: the engine as a user calls it on the original model (OpenVINO: ``compile_model`` with the runner's engine
    properties, ``InferRequest.infer`` with tensors set once; ONNX Runtime: ``InferenceSession.run`` on a session with
    the runner's thread settings, ONNX Runtime's defaults without a hint), and
  - floor: the runner's own compiled engine driven on the runner's tensors, bound once, without npurt in the path
    (OpenVINO: the C++ ``infer``; ONNX Runtime: ``run_with_iobinding``): npurt - floor is npurt's own cost;
- latency, NPU views (option ``hw_view="npu"``: FP16 NHWC on OpenVINO, BF16 HCWNC4 on ONNX Runtime, converted
  inside the compiled model): the same three; floor - raw is what the conversion in the graph costs on CPU;
- throughput: ``execute_async`` keeping ``max_concurrent_runs`` jobs in flight on a THROUGHPUT-hint runner, against
  the raw engine with as many requests (``AsyncInferQueue`` / threads calling ``run``) and the runner's own engine
  settings (OpenVINO's properties; ONNX Runtime's intra-op threads and spinning), in alternating blocks; the ratio
  is the median of per-block ratios.
All subjects take turns in blocks, so that load from other processes hits them alike.

Targets (issues 4 and 5): CPU views: npurt/raw p50 <= 1.03 per model, and on OpenVINO at most 20 us added (paired
p50) on the classifier; NPU views: npurt/floor p50 <= 1.03 (npurt adds nothing to the converting graph); throughput
npurt/raw >= 0.97; no host copy on any of these paths.

    python -m benchmarks.overhead --backend openvino|vaiml [--quick] [--models cls,rec,det] [--json]
"""

from __future__ import annotations

import sys
from typing import Any

from benchmarks import finish, onnxruntime_session, parser
from npurt import RunnerFactory, TensorType
from npurt.bench import (
    Budget,
    Report,
    RunnerSubject,
    Table,
    Target,
    engine_floor,
    measure_latency,
    measure_throughput,
    paired_difference_ms,
    paired_ratio,
    random_feeds,
)
from npurt.bench.compare import Keeper
from npurt.bench.loads import load_openvino
from npurt.bench.subjects import RawOnnxRuntimeSubject, RawOpenVINOSubject
from npurt.models import zoo

MODELS = {  # name -> (zoo model, input shape, latency iterations, throughput jobs per block)
    "cls": ("ocr_cls", (1, 3, 48, 192), 2000, 200),
    "rec": ("ocr_rec", (1, 3, 48, 320), 300, 30),
    "det": ("ocr_det", (1, 3, 640, 640), 40, 8),
}
QUICK_MODELS = "cls"
LATENCY_LIMIT, ADDED_LIMIT_US, THROUGHPUT_LIMIT = 1.03, 20.0, 0.97


def raw_subject(backend: str, runner: Any, path: str, shape: tuple[int, ...], feeds: dict, requests: int,
                label: str = "raw") -> Any:
    """The engine as a user calls it on the original model, with the runner's engine settings: OpenVINO's
    properties; ONNX Runtime's intra-op threads and spinning (default settings where the runner has no hint)."""
    keeper = Keeper()
    inputs = {"x": [list(shape), "float32"]}
    settings = dict(runner.device_info.engine_settings)
    if backend == "OPENVINO":
        load_openvino(keeper, path, "CPU", settings, inputs, {"x": list(shape)})
        return RawOpenVINOSubject(keeper.kept[0], feeds, requests, label)
    return RawOnnxRuntimeSubject(onnxruntime_session(path, settings), feeds, requests, label)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--backend", required=True, type=str.upper, choices=("OPENVINO", "VAIML"))
    p.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)} "
                   f"(default: all; with --quick: {QUICK_MODELS})")
    args = p.parse_args()
    names = (args.models or (QUICK_MODELS if args.quick else ",".join(MODELS))).split(",")
    scale = 4 if args.quick else 1
    backend = args.backend
    report = Report(f"npurt {backend} runner against its engine called directly, CPU, "
                    f"{'quick' if args.quick else 'full'} run")
    latency = Table(["model", "views", "npurt us", "raw us", "floor us", "npurt/raw", "added us", "npurt-floor us",
                     "npurt/floor"], formats=["", "", "{:.1f}", "{:.1f}", "{:.1f}", "{:.3f}", "{:+.1f}", "{:+.1f}",
                                              "{:.3f}"], title="latency, p50 (added: paired p50 of npurt - raw)")
    throughput = Table(["model", "requests", "npurt/s", "raw/s", "npurt/raw"],
                       formats=["", "", "{:.1f}", "{:.1f}", "{:.3f}"],
                       title="throughput, THROUGHPUT hint (npurt/raw: median of paired block ratios)")
    report.tables += [latency, throughput]
    for name in names:
        model, shape, iterations, jobs = MODELS[name]
        path = str(zoo.path(model))
        feeds = random_feeds({"x": (shape, "float32")}, seed=0)
        base = {"device": "CPU", "shapes": {"x": list(shape)}}
        budget = Budget(niter=max(20, iterations // scale), time_s=None, warmup=5)
        for views, options, tensor_type in (
                ("CPU", {"input_tensor_type": "CPU", "output_tensor_type": "CPU"}, TensorType.CPU),
                ("NPU", {"hw_view": "npu"}, TensorType.HW)):
            with RunnerFactory.create_runner(backend, path, {**base, **options}) as runner:
                npurt = RunnerSubject(runner, feeds, 1, tensor_type, label="npurt")
                raw = raw_subject(backend, runner, path, shape, feeds, 1)
                floor = engine_floor(runner, npurt.ins, npurt.outs)
                before = runner.stats["copies"]
                a, b, c = measure_latency([npurt, raw, floor], budget)
                copies = runner.stats["copies"] - before
                raw.close()
            added_us = paired_difference_ms(a, b) * 1e3
            over_floor_us = paired_difference_ms(a, c) * 1e3
            latency.add(name, views, a.p50_ms * 1e3, b.p50_ms * 1e3, c.p50_ms * 1e3, a.p50_ms / b.p50_ms, added_us,
                        over_floor_us, a.p50_ms / c.p50_ms)
            if views == "CPU":
                report.targets.append(Target(f"{name} CPU views npurt/raw p50", a.p50_ms / b.p50_ms, LATENCY_LIMIT))
                if backend == "OPENVINO" and name == "cls":
                    report.targets.append(Target(f"{name} CPU views added (paired p50)", added_us, ADDED_LIMIT_US,
                                                 unit=" us"))
            else:
                report.targets.append(Target(f"{name} NPU views npurt/floor p50", a.p50_ms / c.p50_ms,
                                             LATENCY_LIMIT))
            if copies:
                report.problems.append(f"{name} {views} views: {copies} host copies on the zero-copy path")

        blocks = 5 if args.quick else 9
        tput_budget = Budget(niter=max(8, jobs // scale) * blocks, time_s=None, warmup=2, blocks=blocks)
        with RunnerFactory.create_runner(backend, path, {**base, "input_tensor_type": "CPU",
                                                         "output_tensor_type": "CPU",
                                                         "performance_hint": "THROUGHPUT"}) as runner:
            requests = runner.max_concurrent_runs
            npurt = RunnerSubject(runner, feeds, requests, TensorType.CPU, label="npurt")
            raw = raw_subject(backend, runner, path, shape, feeds, requests)
            before = runner.stats["copies"]
            a, b = measure_throughput([npurt, raw], tput_budget)
            copies = runner.stats["copies"] - before
            raw.close()
        ratio = paired_ratio(a, b)
        throughput.add(name, requests, a.fps, b.fps, ratio)
        report.targets.append(Target(f"{name} throughput npurt/raw", ratio if ratio is not None else float("nan"),
                                     THROUGHPUT_LIMIT, at_most=False))
        if copies:
            report.problems.append(f"{name} throughput: {copies} host copies on the zero-copy path")
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
