"""Start-up: npurt's ``create_runner`` against the engine's own load, cold and from a compiled-model cache.

Each load runs in a fresh process, timed after the imports (``npurt.bench.fresh``): the load itself and the first
inference, and the memory the load adds (VmRSS after the first inference minus VmRSS after the imports). Every
child starts its clock with its main thread moved to the first CPU (then free to go anywhere): ONNX Runtime pins its
pool's worker to the second core, and a caller the imports left there shares that core with the spinning worker
until the kernel moves it (~8 ms on a 2-core VM), which happened after npurt's imports every time and after
onnxruntime's alone about half the time.
- OPENVINO: raw is ``ov.Core()``, ``read_model``, ``reshape`` to the static shape, ``compile_model(model, "CPU",
  {"INFERENCE_PRECISION_HINT": "f32"})``; cached, the same with ``CACHE_DIR`` filled by an earlier process. npurt is
  ``create_runner("OPENVINO", model, {"device": "CPU", "shapes": ...})``; cached, with ``cache_dir`` filled by an
  earlier process (npurt's own cache: OpenVINO's exported model).
- VAIML on CPU (ONNX Runtime's CPU provider, no Vitis AI EP): raw is ``InferenceSession(path)``; cached, the
  model ONNX Runtime optimized and wrote in an earlier process (``SessionOptions.optimized_model_filepath``; for a
  model of 1 MiB or more with its initializers of 64 KiB up in a file beside it), loaded with its optimizations off,
  as ``npurt bench`` does; npurt is ``create_runner("VAIML", ...)``, cold and with ``cache_dir`` filled (the same:
  ONNX Runtime's optimized model, its initializers kept the same way).
Models: the PP-OCR classifier, recognizer and detector, and silero-vad (OpenVINO cannot read the op15 export: it
runs the op18 one). Rounds alternate npurt and raw; figures are medians over the rounds.

Targets (start-up issue): load <= 1.10x the engine's, memory added <= 1.15x, cold and cached, both backends.

    python -m benchmarks.startup [--quick] [--json] [--rounds N] [--models cls,det] [--backends VAIML]
                                 [--cases cached]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from npurt.bench import Report, Table, Target, fresh_loads, loads
from npurt.models import zoo

from . import finish, parser

LOAD_TARGET = 1.10
MEMORY_TARGET = 1.15
F32 = {"INFERENCE_PRECISION_HINT": "f32"}

# model -> (backend -> zoo name), static input shapes and dtypes
MODELS: dict[str, tuple[dict[str, str], dict[str, list[Any]]]] = {
    "cls": ({"OPENVINO": "ocr_cls", "VAIML": "ocr_cls"}, {"x": [[1, 3, 48, 192], "float32"]}),
    "rec": ({"OPENVINO": "ocr_rec", "VAIML": "ocr_rec"}, {"x": [[1, 3, 48, 320], "float32"]}),
    "det": ({"OPENVINO": "ocr_det", "VAIML": "ocr_det"}, {"x": [[1, 3, 640, 640], "float32"]}),
    "silero-vad": ({"OPENVINO": "silero_vad_op18_ifless", "VAIML": "silero_vad"},
                   {"input": [[1, 576], "float32"], "state": [[2, 1, 128], "float32"], "sr": [[], "int64"]}),
}


def subjects(backend: str, path: str, inputs: dict[str, list[Any]], cache: Path, cached: bool
             ) -> list[tuple[Any, dict[str, Any]]]:
    """(npurt, raw) loads for one model, backend and cold/cached case."""
    shapes = {name: shape for name, (shape, _) in inputs.items()}
    options: dict[str, Any] = {"device": "CPU", "shapes": shapes}
    if cached:
        options["cache_dir"] = str(cache / "npurt")
    npurt = (loads.load_npurt, {"backend": backend, "model": path, "options": options, "inputs": inputs})
    if backend == "OPENVINO":
        properties = {**F32, **({"CACHE_DIR": str(cache / "openvino")} if cached else {})}
        raw = (loads.load_openvino, {"model": path, "device": "CPU", "properties": properties, "inputs": inputs,
                                     "shapes": shapes})
    else:
        optimized = str(cache / "onnxruntime" / f"{Path(path).stem}.optimized.onnx") if cached else None
        if optimized is not None:
            Path(optimized).parent.mkdir(parents=True, exist_ok=True)
        raw = (loads.load_onnxruntime, {"model": path, "inputs": inputs, "optimized": optimized})
    return [npurt, raw]


def _choices(p: argparse.ArgumentParser, flag: str, value: str, valid: list[str]) -> list[str]:
    """A comma-separated flag's items, in ``valid``'s order (the parser's error for an unknown one)."""
    given = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in given if v not in valid]
    if unknown or not given:
        p.error(f"{flag}: {', '.join(unknown) or 'nothing'} is not one of {', '.join(valid)}")
    return [v for v in valid if v in given]


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__ or "")
    p.add_argument("--rounds", type=int, default=None, help="fresh-process rounds per figure (default 5; 2 quick)")
    p.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)} (default: all; cls "
                                                  "with --quick)")
    p.add_argument("--backends", default="OPENVINO,VAIML", help="comma-separated, of OPENVINO, VAIML")
    p.add_argument("--cases", default="cold,cached", help="comma-separated, of cold, cached")
    args = p.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    models = _choices(p, "--models", args.models, list(MODELS)) if args.models else \
        ["cls"] if args.quick else list(MODELS)
    backends = _choices(p, "--backends", args.backends.upper(), ["OPENVINO", "VAIML"])
    cases = [case == "cached" for case in _choices(p, "--cases", args.cases.lower(), ["cold", "cached"])]
    table = Table(["model", "backend", "load", "npurt ms", "raw ms", "npurt/raw", "1st inference npurt/raw ms",
                   "npurt MiB", "raw MiB", "memory npurt/raw"])
    targets = []
    for model in models:
        names, inputs = MODELS[model]
        for backend in backends:
            path = str(zoo.path(names[backend]))
            for cached in cases:
                with tempfile.TemporaryDirectory(prefix="npurt-startup-") as tmp:
                    pair = subjects(backend, path, inputs, Path(tmp), cached)
                    npurt, raw = fresh_loads(pair, runs=rounds, fill_first=cached,
                                             label=f"{model} {backend} {'cached' if cached else 'cold'}")
                case = "cached" if cached else "cold"
                load_ratio = npurt.load_ms / raw.load_ms
                memory_ratio = npurt.rss_added_mib / raw.rss_added_mib if raw.rss_added_mib > 0 else float("nan")
                table.add(model, backend, case, npurt.load_ms, raw.load_ms, load_ratio,
                          f"{npurt.first_inference_ms:.1f} / {raw.first_inference_ms:.1f}", npurt.rss_added_mib,
                          raw.rss_added_mib, memory_ratio)
                label = f"{model} {backend}" + (" on CPU" if backend == "VAIML" else "")
                targets.append(Target(f"{label} {case}: load npurt/raw", load_ratio, LOAD_TARGET))
                targets.append(Target(f"{label} {case}: memory npurt/raw", memory_ratio, MEMORY_TARGET))
    report = Report("Start-up: create_runner against the engine's own load, in fresh processes "
                    f"(medians of {rounds} rounds)", tables=[table], targets=targets,
                    notes=["VAIML on CPU: ONNX Runtime's CPU provider, no Vitis AI EP"])
    return finish(report, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
