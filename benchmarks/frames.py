"""Camera frames into a model: npurt's option ``frames`` against the usual app code, per 1080p frame.

For a 1920x1080 frame, BGR (as OpenCV decodes it) and NV12 (as video decoders hand it: a Y plane and an interleaved
UV plane, in one buffer), into PP-OCR's text-direction classifier (48x192) and its text detector (544x960), on each
backend's CPU device, it times per frame two apps and npurt, each app into a runner of the same model with its input
pinned to the model's size:
- OpenCV (the baseline): what an experienced OpenCV user writes, all in OpenCV then ``run()``: the uint8 frame
  resized first (NV12: ``cv2.resize`` of the Y plane to the model's size and of the UV plane to half of it, then
  ``cv2.cvtColorTwoPlane(..., COLOR_YUV2BGR_NV12)``), normalised and laid out in one pass by
  ``cv2.dnn.blobFromImage`` (BGR: which resizes too, INTER_LINEAR);
- usual: what most apps write, OpenCV and numpy: for NV12 ``cv2.cvtColor(..., COLOR_YUV2BGR_NV12)`` of the whole
  frame, then ``cv2.resize`` (INTER_LINEAR) of the uint8 frame, ``(x - 127.5) / 127.5`` in float32, transposed to
  NCHW;
- npurt: the frame itself into a runner opened with option ``frames`` (format, model_color BGR, mean and std 127.5,
  the model's size): colour, resize, layout and normalisation run in the compiled model.
Same engine, same device, same thread settings (the runners' defaults); the two take turns (``npurt.bench``).
Each row gives an app's median wall time and process CPU time per frame (every thread: the engine's too), npurt's,
and frames per second as npurt's over that app's (wall). The results agree within the tolerance the docs state: the
classifier's scores by at most 0.02, the detector's text probabilities by at most 0.06 (both sides resize uint8
pixels; OpenCV's fixed-point weights and the engines' round a level apart, and NV12's chroma is interpolated from
its half-size plane on npurt's side, upsampled by OpenCV's cvtColor on the apps').

Targets (issues 32, 39): frames per second >= 1.0x the faster app's on every OpenVINO model and frame format; no host
copy by either runner. The
ONNX Runtime rows (VAIML on ONNX Runtime's CPU provider) are reported with their ratio, no target.

    python -m benchmarks.frames [--quick] [--frames N] [--json]
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

from benchmarks import finish, parser
from npurt import RunnerFactory, TensorDirection
from npurt.bench import Budget, CallSubject, Report, Table, Target, measure_latency
from npurt.models import zoo

H, W = 1080, 1920
MODELS = {"cls": (48, 192), "det": (544, 960)}  # the model's size: PP-OCR's classifier; the detector at 960 wide
BACKENDS = ("OPENVINO", "VAIML")
TOLERANCE = {"cls": 0.02, "det": 0.06}  # the largest difference of a score / probability between the two sides


def frame_1080p() -> tuple[np.ndarray, np.ndarray]:
    """A document-like BGR frame (lines of text on paper, on a desk) and its NV12 buffer [H * 3/2, W]."""
    bgr = np.full((H, W, 3), (92, 104, 110), np.uint8)
    bgr[120:960, 300:1620] = 245
    for k in range(9):
        cv2.putText(bgr, f"line {k}: frames straight into the model", (340, 220 + 85 * k), cv2.FONT_HERSHEY_SIMPLEX,
                    2.0, (20, 20, 20), 4)
    yuv = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    u = yuv[H:H + H // 4].reshape(H // 2, W // 2)
    v = yuv[H + H // 4:].reshape(H // 2, W // 2)
    nv12 = np.concatenate([yuv[:H], np.stack([u, v], -1).reshape(H // 2, W)])
    return bgr, nv12


def opencv_side(runner: Any, fmt: str, size: tuple[int, int], frame: np.ndarray
                ) -> Callable[[], dict[str, np.ndarray]]:
    """The experienced user's OpenCV code: resize first (NV12: plane by plane, then cvtColorTwoPlane), then
    blobFromImage's normalisation and NCHW layout in one pass, then run()."""
    h, w = size

    def infer() -> dict[str, np.ndarray]:
        if fmt == "NV12":
            y = cv2.resize(frame[:H], (w, h), interpolation=cv2.INTER_LINEAR)
            uv = cv2.resize(frame[H:].reshape(H // 2, W // 2, 2), (w // 2, h // 2), interpolation=cv2.INTER_LINEAR)
            bgr = cv2.cvtColorTwoPlane(y, uv, cv2.COLOR_YUV2BGR_NV12)
            x = cv2.dnn.blobFromImage(bgr, 1 / 127.5, mean=(127.5, 127.5, 127.5))
        else:
            x = cv2.dnn.blobFromImage(frame, 1 / 127.5, (w, h), mean=(127.5, 127.5, 127.5))
        return runner.run({"x": x})

    return infer


def app_side(runner: Any, fmt: str, size: tuple[int, int], frame: np.ndarray) -> Callable[[], dict[str, np.ndarray]]:
    """The usual app code: OpenCV colour and resize, numpy normalisation, then run()."""
    h, w = size

    def infer() -> dict[str, np.ndarray]:
        bgr = cv2.cvtColor(frame, cv2.COLOR_YUV2BGR_NV12) if fmt == "NV12" else frame
        resized = cv2.resize(bgr, (w, h), interpolation=cv2.INTER_LINEAR)
        x = np.ascontiguousarray(((resized.astype(np.float32) - 127.5) / 127.5).transpose(2, 0, 1)[None])
        return runner.run({"x": x})

    return infer


def npurt_side(runner: Any, fmt: str, frame: np.ndarray) -> Callable[[], dict[str, np.ndarray]]:
    """The frame itself (NV12: its two planes, views of the one buffer) into the frames runner."""
    feeds = ({"x": frame[None]} if fmt == "BGR" else
             {"x/y": frame[:H].reshape(1, H, W, 1), "x/uv": frame[H:].reshape(1, H // 2, W // 2, 2)})
    return lambda: runner.run(feeds)


def with_cpu_time(fn: Callable[[], Any], spent: list[float]) -> Callable[[], Any]:
    def timed() -> Any:
        start = time.process_time()
        fn()
        spent.append(time.process_time() - start)

    return timed


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--frames", type=int, default=40, help="frames per side and row (default 40)")
    args = p.parse_args()
    count = 6 if args.quick else args.frames
    bgr, nv12 = frame_1080p()
    report = Report(f"1080p frames into PP-OCR: npurt's frames vs OpenCV + numpy + run(), median of {count} per "
                    f"side, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    table = Table(["backend", "model", "frame", "app", "app ms", "npurt ms", "app CPU ms", "npurt CPU ms",
                   "fps vs app", "max |diff|"],
                  formats=["", "", "", "", "{:.1f}", "{:.1f}", "{:.1f}", "{:.1f}", "{:.2f}x", "{:.4f}"])
    report.tables.append(table)
    for backend in BACKENDS:
        for model, size in MODELS.items():
            path = zoo.path(f"ocr_{model}")
            plain = RunnerFactory.create_runner(backend, path, {"device": "CPU", "shapes": {"x": [1, 3, *size]}})
            for fmt, frame in (("BGR", bgr), ("NV12", nv12)):
                spec = {"format": fmt, "model_color": "BGR", "mean": 127.5, "std": 127.5, "model_size": list(size)}
                with RunnerFactory.create_runner(backend, path, {"device": "CPU", "frames": {"x": spec}}) as framed:
                    apps = {"OpenCV": opencv_side(plain, fmt, size, frame), "usual": app_side(plain, fmt, size, frame)}
                    ours = npurt_side(framed, fmt, frame)
                    (name,) = [t.name for t in framed.get_tensors_info(TensorDirection.OUTPUT)]
                    mine = ours()[name]
                    diffs = {k: float(np.abs(app()[name] - mine).max()) for k, app in apps.items()}
                    cpu: dict[str, list[float]] = {k: [] for k in (*apps, "npurt")}
                    budget = Budget(niter=count, time_s=None, warmup=2, blocks=count // 2 or 1, settle=0)
                    sides = {**apps, "npurt": ours}
                    stats = measure_latency([CallSubject(k, with_cpu_time(fn, cpu[k])) for k, fn in sides.items()],
                                            budget)
                    ms = {k: s.p50_ms for k, s in zip(sides, stats)}
                    cpu_ms = {k: 1e3 * float(np.median(c)) for k, c in cpu.items()}
                    row = f"{backend} {model} {fmt}"
                    for k in apps:
                        table.add(backend, model, f"{fmt} 1080p", k, ms[k], ms["npurt"], cpu_ms[k], cpu_ms["npurt"],
                                  ms[k] / ms["npurt"], diffs[k])
                        if diffs[k] > TOLERANCE[model]:
                            report.problems.append(f"{row}: npurt and the {k} app differ by {diffs[k]:.4f} "
                                                   f"(> {TOLERANCE[model]})")
                    if framed.stats["copies"]:
                        report.problems.append(f"{row}: npurt's frames runner made {framed.stats['copies']} copies")
                    if backend == "OPENVINO":
                        fastest = min(apps, key=lambda k: ms[k])
                        report.targets.append(Target(f"{row}: frames per second vs the faster app ({fastest})",
                                                     ms[fastest] / ms["npurt"], 1.0, at_most=False, unit="x"))
            plain.close()
    report.notes.append("VAIML rows: ONNX Runtime's CPU provider (no NPU here); OPENVINO rows: OpenVINO's CPU plugin")
    report.notes.append("CPU ms: process CPU time per frame (every thread); the apps' include OpenCV's threads")
    report.notes.append("OpenCV: resize first, cvtColorTwoPlane (NV12), blobFromImage; usual: cvtColor of the whole "
                        "frame, resize, numpy normalisation")
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
