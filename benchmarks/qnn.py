"""Qualcomm's HTP through npurt (RunnerType.QNN, device NPU) against ONNX Runtime + QNN EP used directly, on
Qualcomm's HTP emulator (onnxruntime-qnn on x86-64: the NPU's compiler and numerics, not its speed; every figure here
is an emulator's, and says nothing of a Snapdragon's speed).

Both sides use the same provider options (npurt's defaults: backend_type=htp, enable_htp_fp16_precision=1,
soc_model=60), the same static shapes and the same session settings (one intra-op thread: the environment variable
NPURT_NUM_THREADS is cleared, and the raw session gets npurt's thread count). The raw side is what the QNN EP's
documentation shows: the library registered once, the QNN device added to the session options, the model's dims
fixed (the HTP compiles static shapes).

- overhead: ``runner.run(feeds)`` against ``session.run(None, feeds)``, and ``runner.execute`` on runner-allocated
  tensors against ``run_with_iobinding`` on tensors bound once, CPU views (the model's own), alternating blocks;
- load: a compile (npurt: ``create_runner`` with an empty ``cache_dir``, which also stores the context binary;
  raw: ``InferenceSession`` with ``ep.context_enable``) against a load of the compiled model (npurt: the same
  ``create_runner`` again, from its cache; raw: ``InferenceSession`` on the EPContext model), medians of runs in
  this process (the QNN library already loaded).

Targets (issue 29): run() within 1.02x of raw; a cached load <= 0.2x of a compile; no host copy on the execute path.

    python -m benchmarks.qnn [--quick] [--json]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks import finish, parser
from npurt import RunnerFactory, TensorDirection, TensorType
from npurt.backends.onnxruntime import plugins
from npurt.bench import Budget, CallSubject, Report, Table, Target, measure_latency
from npurt.models import DEFAULT_MODEL, zoo
from npurt.onnx_edit import static_model

QNN_OPTIONS = {"backend_type": "htp", "enable_htp_fp16_precision": "1", "soc_model": "60"}
THREADS = 1
MODELS = {  # name -> (path, input, static shape, latency iterations)
    "default": (lambda: DEFAULT_MODEL, "image", (1, 1, 8, 8), 400),
    "cls": (lambda: zoo.path("ocr_cls"), "x", (1, 3, 48, 192), 24),
}
RUN_LIMIT, CACHED_LOAD_LIMIT = 1.02, 0.2


def raw_session(model: str | bytes, extra: dict[str, str] | None = None) -> ort.InferenceSession:
    (device,) = plugins.ep_devices("QNNExecutionProvider")[:1]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = THREADS
    for key, value in (extra or {}).items():
        so.add_session_config_entry(key, value)
    so.add_provider_for_devices([device], QNN_OPTIONS)
    return ort.InferenceSession(model, so)


def npurt_options(name: str, shape: tuple[int, ...], **more: Any) -> dict[str, Any]:
    return {"device": "NPU", "shapes": {name: list(shape)}, "input_tensor_type": "CPU", "output_tensor_type": "CPU",
            "num_threads": THREADS, "log_level": "ERROR", **more}


def overhead(label: str, path: Path, name: str, shape: tuple[int, ...], iterations: int, table: Table,
             report: Report, work: Path) -> None:
    x = np.random.default_rng(0).random(shape, np.float32)
    raw = raw_session(str(static_model(path, {name: shape}, work / f"{label}_static.onnx")))
    out_name = raw.get_outputs()[0].name
    raw_out = np.zeros(raw.get_outputs()[0].shape, np.float32)
    binding = raw.io_binding()
    binding.bind_input(name, "cpu", 0, np.float32, list(shape), x.ctypes.data)
    binding.bind_output(out_name, "cpu", 0, np.float32, list(raw_out.shape), raw_out.ctypes.data)
    with RunnerFactory.create_runner("QNN", path, npurt_options(name, shape)) as runner:
        assert runner.device_info.attached == "NPU", runner.device_info.summary()
        xin = runner.allocate_npu_tensor(runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0])
        yout = runner.allocate_npu_tensor(runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0])
        xin.numpy()[...] = x
        feeds = {name: x}
        expected = raw.run(None, feeds)[0]
        if not np.array_equal(runner.run(feeds)[out_name], expected):
            report.problems.append(f"{label}: npurt's run() differs from raw ONNX Runtime + QNN EP's")
        budget = Budget(niter=iterations, time_s=None, warmup=3, blocks=6)
        before = runner.stats["copies"]
        npurt_run, raw_run, npurt_exec, raw_bound = measure_latency([
            CallSubject("npurt run()", lambda: runner.run(feeds)),
            CallSubject("raw session.run", lambda: raw.run(None, feeds)),
            CallSubject("npurt execute", lambda: runner.execute([[xin]], [[yout]])),
            CallSubject("raw run_with_iobinding", lambda: raw.run_with_iobinding(binding)),
        ], budget)
        copies = runner.stats["copies"] - before
        if not np.array_equal(yout.numpy(), expected):
            report.problems.append(f"{label}: npurt's execute() differs from raw ONNX Runtime + QNN EP's")
    table.add(label, "run()", npurt_run.p50_ms, raw_run.p50_ms, npurt_run.p50_ms / raw_run.p50_ms)
    table.add(label, "execute / iobinding", npurt_exec.p50_ms, raw_bound.p50_ms, npurt_exec.p50_ms / raw_bound.p50_ms)
    report.targets.append(Target(f"{label} run() npurt/raw p50", npurt_run.p50_ms / raw_run.p50_ms, RUN_LIMIT))
    if copies:
        report.problems.append(f"{label}: {copies} host copies on the execute path")


def loads(label: str, path: Path, name: str, shape: tuple[int, ...], runs: int, table: Table, report: Report,
          work: Path) -> None:
    static = static_model(path, {name: shape}, work / f"{label}_load.onnx")
    times: dict[str, list[float]] = {"npurt compile": [], "npurt cached": [], "raw compile": [], "raw cached": []}
    for k in range(runs):
        cache = work / f"{label}_cache{k}"
        for what in ("npurt compile", "npurt cached"):
            t0 = time.perf_counter()
            with RunnerFactory.create_runner("QNN", path, npurt_options(name, shape, cache_dir=str(cache))) as r:
                times[what].append((time.perf_counter() - t0) * 1e3)
                step = [s for s, _ in r.device_info.load_steps][-1]
                want = "loaded from the cache" if what == "npurt cached" else "compiled and stored in the cache"
                if step != want:
                    report.problems.append(f"{label} {what}: the load says {step!r}")
        context = work / f"{label}_ctx{k}.onnx"
        t0 = time.perf_counter()
        raw_session(str(static), {"ep.context_enable": "1", "ep.context_file_path": str(context),
                                  "ep.context_embed_mode": "1"})
        times["raw compile"].append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        raw_session(str(context))
        times["raw cached"].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    table.add(label, med["npurt compile"], med["npurt cached"], med["npurt cached"] / med["npurt compile"],
              med["raw compile"], med["raw cached"], med["raw cached"] / med["raw compile"])
    report.targets.append(Target(f"{label} npurt cached load / compile", med["npurt cached"] / med["npurt compile"],
                                 CACHED_LOAD_LIMIT))


def main() -> int:
    args = parser(__doc__).parse_args()
    if plugins.register("onnxruntime_qnn").error:
        print("onnxruntime-qnn is not installed: pip install 'npurt[qnn]'", file=sys.stderr)
        return 2
    report = Report(f"RunnerType.QNN against ONNX Runtime {ort.__version__} + QNN EP, on Qualcomm's HTP emulator "
                    f"(x86-64; not a Snapdragon's speed), {'quick' if args.quick else 'full'} run")
    report.notes.append(f"provider options {QNN_OPTIONS}; one intra-op thread on both sides (NPURT_NUM_THREADS "
                        "cleared); CPU views; npurt bit for bit against raw (checked)")
    overheads = Table(["model", "call", "npurt ms", "raw ms", "npurt/raw"], formats=["", "", "{:.3f}", "{:.3f}",
                                                                                      "{:.3f}"],
                      title="per call, p50 (alternating blocks)")
    load_table = Table(["model", "npurt compile ms", "npurt cached ms", "cached/compile", "raw compile ms",
                        "raw cached ms", "cached/compile"],
                       formats=["", "{:.1f}", "{:.1f}", "{:.3f}", "{:.1f}", "{:.1f}", "{:.3f}"],
                       title="load: a compile against a load of the compiled model (medians)")
    report.tables += [overheads, load_table]
    with tempfile.TemporaryDirectory(prefix="npurt-qnn-bench-") as tmp:
        work = Path(tmp)
        for label, (model, name, shape, iterations) in MODELS.items():
            if args.quick and label == "cls":
                iterations = 6
            overhead(label, model(), name, shape, iterations if not args.quick else max(6, iterations // 8),
                     overheads, report, work)
            loads(label, model(), name, shape, 2 if args.quick else 5, load_table, report, work)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
