"""`npurt bench [MODEL]`: latency, throughput and loads of one or both backends, optionally against the raw engines,
measured by ``npurt.bench.bench_backend`` and formatted by ``npurt.bench.render``."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

from ..modelinfo import concrete_input_shapes
from .common import (
    EXIT_USAGE,
    CliError,
    add_model_options,
    ask_for_shapes,
    load_model_file,
    model_label,
    no_backend_message,
    one_line,
    pinned_shapes,
    resolve_backend,
    runner_options,
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", parents=[common], help="latency, throughput and loads, optionally against the raw "
                       "engines", description="Measure load and first inference (in this process and in fresh "
                       "ones, with the memory each load adds), execute latency and execute_async throughput for one "
                       "or both backends; with --compare-raw the same figures for the engine called directly on the "
                       "same model, in the same run, in alternating blocks.")
    p.add_argument("model", metavar="MODEL", nargs="?", help="an ONNX or OpenVINO IR model (default: embedded)")
    add_model_options(p, "openvino, vaiml or both", "both")
    p.add_argument("--niter", type=int, metavar="N", help="iterations per measurement")
    p.add_argument("--time", type=float, metavar="S",
                   help="seconds per measurement (default: 3, or unbounded when --niter is given)")
    p.add_argument("--warmup", type=int, default=5, metavar="N", help="warm-up runs before timing (default: 5)")
    p.add_argument("--requests", type=int, default=2, metavar="N",
                   help="async requests in flight for the throughput (default: 2)")
    p.add_argument("--compare-raw", action="store_true",
                   help="measure the raw engine (OpenVINO / ONNX Runtime called directly) in the same run")
    p.add_argument("--cache-dir", metavar="DIR", help="also time the loads from a compiled-model cache in DIR")
    p.add_argument("--load-runs", type=int, default=3, metavar="N",
                   help="loads timed in fresh processes, with the memory each adds (default: 3; 0: none)")
    p.add_argument("--hint", choices=("LATENCY", "THROUGHPUT", "latency", "throughput"),
                   help="the engine's performance hint, for npurt and the raw engine alike")
    p.add_argument("--tensor-type", choices=("HW", "CPU", "hw", "cpu"), default="HW",
                   help="the view of the ports and runner-allocated tensors (default: HW, on CPU the model's own "
                        "unless --hw-view npu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, value, least in (("--niter", args.niter, 1), ("--requests", args.requests, 1),
                               ("--warmup", args.warmup, 0), ("--load-runs", args.load_runs, 0)):
        if value is not None and value < least:
            raise CliError(f"{flag} {value}: must be at least {least}", EXIT_USAGE)
    if args.time is not None and not args.time > 0:
        raise CliError(f"--time {args.time}: must be more than 0 seconds", EXIT_USAGE)


BOTH_ENGINES = ("OPENVINO", "VAIML")


def _backends(which: str) -> tuple[list[str], dict[str, str]]:
    """The backends to measure, and those of ``both`` that are not installed (with why). ``both``: the two engines,
    OpenVINO and ONNX Runtime (VAIML's adapter; QNN and ONNXRUNTIME run the same adapter on another EP)."""
    from ..factory import RunnerFactory

    if which.upper() != "BOTH":
        name = resolve_backend(which)
        if name == "AUTO":
            raise CliError("bench measures named backends: use --backend openvino, vaiml or both", EXIT_USAGE)
        return [name], {}
    installed = RunnerFactory.available_backends()
    backends = [b for b in BOTH_ENGINES if b in installed]
    if not backends:
        raise CliError(no_backend_message())
    return backends, {b: "not installed" for b in BOTH_ENGINES if b not in installed}


def run(args: argparse.Namespace) -> int:
    from .. import __version__
    from ..bench import BenchReport, BenchSettings, Budget, Progress, bench_backend, render
    from ..models import default_model_path
    from ..types import NpuFallbackWarning, TensorType

    embedded = args.model is None
    path = default_model_path() if embedded else Path(args.model)
    model = load_model_file(path)
    shapes = pinned_shapes(args, model)
    _check_numbers(args)
    choice = concrete_input_shapes(model, shapes)
    declared = {p.name: p for p in model.inputs}
    if choice.unresolved:
        raise ask_for_shapes(choice.unresolved, "measure")
    backends, missing = _backends(args.backend)
    if model.format != "onnx" and args.backend.upper() == "BOTH" and "VAIML" in backends:
        backends.remove("VAIML")  # ONNX Runtime reads ONNX only
        missing["VAIML"] = f"not measured: ONNX Runtime reads ONNX models only, {path.name} is {model.format}"
    if not backends:
        raise CliError(f"no installed backend reads {path.name} ({model.format})")
    time_s = args.time if args.time is not None else (None if args.niter is not None else 3.0)
    budget = Budget(niter=args.niter, time_s=time_s, warmup=args.warmup)
    progress = Progress(enabled=not args.no_progress)
    tensor_type = TensorType[args.tensor_type.upper()]
    options = runner_options(args, shapes)
    report = BenchReport(
        npurt_version=__version__, model=str(path), model_label=model_label(path, embedded),
        settings=BenchSettings(device=args.device, shapes={n: list(s) for n, s in shapes.items()},
                               niter=args.niter, time_s=time_s, warmup=args.warmup, requests=args.requests,
                               tensor_type=tensor_type.name, hw_view=args.hw_view, performance_hint=args.hint,
                               cache_dir=args.cache_dir, compare_raw=args.compare_raw, load_runs=args.load_runs,
                               seed=args.seed),
        skipped=missing,
        input_notes=[f"input {n} has dynamic dims {declared[n].shape_text()}: measured at "
                     f"{list(s)} (the open batch dim as 1; --shape pins another)" for n, s in choice.picked.items()])
    for name in backends:
        cache = Path(args.cache_dir) if args.cache_dir else None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", NpuFallbackWarning)
                entry = bench_backend(name, path, options, budget, requests=args.requests,
                                      input_shapes=choice.shapes, seed=args.seed, tensor_type=tensor_type,
                                      compare_raw=args.compare_raw, cache_dir=cache, load_runs=args.load_runs,
                                      progress=progress)
        except ValueError as e:
            raise CliError(one_line(e), EXIT_USAGE) from e
        except Exception as e:
            if args.debug:
                raise
            raise CliError(f"{name} on {path.name}: {one_line(e)}") from e
        entry.fallbacks = sorted({one_line(w.message) for w in caught if issubclass(w.category, NpuFallbackWarning)})
        report.results.append(entry)
    print(render(report, as_json=args.json))
    return 0
