"""npurt against its raw engine on one model, in one run: what `npurt bench` measures for each backend.

``bench_backend`` loads the runner (and, with ``compare_raw``, the engine the runner reports, called directly with
the settings the runner put on it: OpenVINO ``compile_model`` with the runner's engine properties, ONNX Runtime
``InferenceSession(path)`` as a user makes one), timing the load and the first inference in this process (the
engines' libraries loaded beforehand) and, with ``load_runs``, in fresh processes with the memory each load adds;
with ``cache_dir`` also the loads from a compiled-model cache. Then it measures latency and throughput of both in
alternating blocks (``measure``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..factory import RunnerFactory
from ..runner import Runner
from ..types import TensorDirection, TensorType
from . import loads
from .fresh import fresh_loads
from .measure import (
    NO_PROGRESS,
    Budget,
    Progress,
    Subject,
    measure_latency,
    measure_throughput,
    paired_difference_ms,
    paired_ratio,
)
from .results import BackendBench, FreshLoad, LoadTimes, Side
from .subjects import RawOnnxRuntimeSubject, RawOpenVINOSubject, RunnerSubject, runner_feeds


class Keeper:
    """The in-process stand-in for a fresh process's probe: keeps what a load function made."""

    def __init__(self) -> None:
        self.kept: list[Any] = []

    def baseline(self) -> None:
        pass

    def keep(self, obj: Any) -> Any:
        self.kept.append(obj)
        return obj


def raw_engine_of(engine: str) -> str:
    """"openvino" or "onnxruntime": the raw engine behind a runner's ``device_info.engine`` ("" if none)."""
    engine = engine.lower()
    return "openvino" if "openvino" in engine else "onnxruntime" if "onnx" in engine else ""


def onnxruntime_providers(device: str) -> list[str]:
    """The providers a raw ONNX Runtime session uses for the device the runner attached."""
    return ["VitisAIExecutionProvider", "CPUExecutionProvider"] if device == "NPU" else ["CPUExecutionProvider"]


def _loaded(figures: Mapping[str, Any]) -> LoadTimes:
    return LoadTimes(figures["load_ms"], figures["first_inference_ms"])


class _RawEngine:
    """How to load the raw engine: in this process or a fresh one, with or without its cache."""

    def __init__(self, kind: str, model: Path, runner: Runner, inputs: dict[str, list[Any]],
                 pinned: Mapping[str, Sequence[int]] | None, cache_dir: Path | None) -> None:
        info = runner.device_info
        self.kind, self.model, self.inputs = kind, str(model), inputs
        self.device = info.attached
        self.cache_dir = cache_dir
        if kind == "openvino":
            import openvino as ov

            self.label, self.engine, self.version = "raw OpenVINO", "OpenVINO", ov.get_version()
            self.settings = dict(info.engine_settings)  # the properties npurt compiled with (all but CACHE_DIR)
            self.call = RawOpenVINOSubject.call
            self.pinned = {n: list(s) for n, s in (pinned or {}).items()}
        else:
            import onnxruntime as ort

            self.label, self.engine, self.version = "raw ONNX Runtime", "ONNX Runtime", ort.__version__
            self.settings = {"providers": ", ".join(onnxruntime_providers(self.device)),
                             "SessionOptions": "defaults"}
            self.call = RawOnnxRuntimeSubject.call

    def target(self, cached: bool) -> tuple[Any, dict[str, Any]]:
        if self.kind == "openvino":
            properties = dict(self.settings)
            if cached and self.cache_dir is not None:
                properties["CACHE_DIR"] = str(self.cache_dir / "raw-openvino")
            return loads.load_openvino, {"model": self.model, "device": self.device, "properties": properties,
                                         "inputs": self.inputs, "shapes": self.pinned or None}
        optimized = str(self.cache_dir / "raw-onnxruntime" / f"{Path(self.model).stem}.optimized.onnx") \
            if cached and self.cache_dir is not None else None
        return loads.load_onnxruntime, {"model": self.model, "inputs": self.inputs,
                                        "providers": onnxruntime_providers(self.device), "optimized": optimized}

    def load_here(self, cached: bool = False) -> tuple[Any, LoadTimes]:
        """Load in this process: (the compiled model or session, its load times)."""
        if cached and self.cache_dir is not None:
            (self.cache_dir / f"raw-{self.kind}").mkdir(parents=True, exist_ok=True)
        fn, kwargs = self.target(cached)
        keeper = Keeper()
        figures = fn(keeper, **kwargs)
        return keeper.kept[0], _loaded(figures)

    def subject(self, compiled: Any, feeds: Mapping[str, np.ndarray], requests: int) -> Subject:
        if self.kind == "openvino":
            return RawOpenVINOSubject(compiled, feeds, requests, self.label)
        return RawOnnxRuntimeSubject(compiled, feeds, requests, self.label)


def bench_backend(backend: str, model: str | Path, options: Mapping[str, Any], budget: Budget, *,
                  requests: int = 2, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  seed: int = 0, tensor_type: TensorType = TensorType.HW, compare_raw: bool = False,
                  cache_dir: str | Path | None = None, load_runs: int = 0,
                  progress: Progress = NO_PROGRESS) -> BackendBench:
    """Every figure of one backend (see the module's docstring).

    ``options``: the runner's options (``shapes`` pins static engines; the raw OpenVINO compile is reshaped alike);
    ``input_shapes``: the CPU-view shapes to feed where the runner's inputs are dynamic.
    """
    name = backend.upper()
    model = Path(model)
    cache = Path(cache_dir) if cache_dir is not None else None
    options = {**options, "max_concurrent_runs": requests, "input_tensor_type": tensor_type.name,
               "output_tensor_type": tensor_type.name}
    npurt_target: tuple[Any, dict[str, Any]] = (loads.load_npurt, {"backend": name, "model": str(model),
                                                                    "options": options})

    # Once untimed: the engine's libraries and plugins get loaded, as they are for the raw engine measured later.
    progress.phase(f"{name}: loading the engine")
    with RunnerFactory.create_runner(name, model, options) as runner:
        feeds = runner_feeds(runner, input_shapes, seed)
    inputs = {n: [list(a.shape), str(a.dtype)] for n, a in feeds.items()}
    npurt_kwargs = {**npurt_target[1], "inputs": inputs}
    npurt_cached_kwargs = {**npurt_kwargs, "options": {**options, "cache_dir": str(cache / name.lower())}} \
        if cache is not None else None

    cached_load = None
    if npurt_cached_kwargs is not None:
        progress.phase(f"{name}: load with cache_dir (fill, then from the cache)")
        for _ in range(2):  # the first fills the cache (if it was empty), the second reads it
            keeper = Keeper()
            cached_load = _loaded(loads.load_npurt(keeper, **npurt_cached_kwargs))
            keeper.kept[0].close()
    progress.phase(f"{name}: load + compile + first inference")
    keeper = Keeper()
    load = _loaded(loads.load_npurt(keeper, **npurt_kwargs))
    runner = keeper.kept[0]
    subjects: list[Subject] = []
    try:
        info = runner.device_info
        kind = raw_engine_of(info.engine) if compare_raw else ""
        raw = _RawEngine(kind, model, runner, inputs, options.get("shapes"), cache) if kind else None
        npurt = Side("npurt", info.engine, info.engine_version, info.attached, "Runner.execute on runner-allocated "
                     "tensors; execute_async for throughput", dict(info.engine_settings), load, cached_load)
        raw_side = None
        compiled = None
        if raw is not None:
            progress.phase(f"{raw.label}: load + first inference")
            raw_cached = None
            if cache is not None:
                raw.load_here(cached=True)  # fills the cache
                raw_cached = raw.load_here(cached=True)[1]
            compiled, raw_load = raw.load_here()
            raw_side = Side(raw.label, raw.engine, raw.version, raw.device, raw.call, raw.settings, raw_load,
                            raw_cached)
        if load_runs:
            targets = [(loads.load_npurt, npurt_kwargs)] + ([raw.target(False)] if raw else [])
            fresh = fresh_loads(targets, load_runs, progress=progress, label=f"{name}: loads in fresh processes")
            npurt.fresh, raw_fresh = fresh[0], (fresh[1] if raw else None)
            fresh_cached: list[FreshLoad | None] = [None, None]
            if npurt_cached_kwargs is not None:
                targets = [(loads.load_npurt, npurt_cached_kwargs)] + ([raw.target(True)] if raw else [])
                fresh_cached = list(fresh_loads(targets, load_runs, progress=progress,
                                                label=f"{name}: cached loads in fresh processes")) + [None]
            npurt.fresh_cached = fresh_cached[0]
            if raw_side is not None:
                raw_side.fresh, raw_side.fresh_cached = raw_fresh, fresh_cached[1]

        subjects.append(RunnerSubject(runner, feeds, requests, tensor_type, label=name))
        if raw is not None:
            subjects.append(raw.subject(compiled, feeds, requests))
        who = " and ".join(s.label for s in subjects)
        before = runner.stats
        latencies = measure_latency(subjects, budget, progress, f"{who}: latency")
        after = runner.stats
        throughputs = measure_throughput(subjects, budget, progress, f"{who}: {requests}-request throughput")
        npurt.latency, npurt.throughput = latencies[0], throughputs[0]
        executes = after["executes"] - before["executes"]
        result = BackendBench(
            backend=name, device=_device_line(info), device_info=_device_info_dict(info), tensor_type=tensor_type.name,
            inputs={i.name: list(feeds[i.name].shape)
                    for i in runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)},
            npurt=npurt, raw=raw_side,
            raw_missing="" if raw is not None or not compare_raw else f"no raw engine known for {info.engine!r}",
            copies_per_inference=(after["copies"] - before["copies"]) / executes if executes else 0.0,
            stats=runner.stats)
        if raw_side is not None:
            raw_side.latency, raw_side.throughput = latencies[1], throughputs[1]
            result.latency_added_ms = paired_difference_ms(latencies[0], latencies[1])
            result.throughput_ratio = paired_ratio(throughputs[0], throughputs[1])
        return result
    finally:
        for s in subjects:
            s.close()
        runner.close()


def _device_line(info: Any) -> str:
    """Where a runner runs, with the engine's release number (not its build string)."""
    line = f"{info.engine} {info.engine_version.split('-')[0]} on {info.attached}"
    line += f" ({info.full_name})" if info.full_name else ""
    line += f" [asked for {info.requested}; fell back: {info.reason}]" if info.fell_back else ""
    return line + ("; nodes: " + ", ".join(f"{p}: {n}" for p, n in info.placement) if info.placement else "")


def _device_info_dict(info: Any) -> dict[str, Any]:
    d = dataclasses.asdict(info)
    for key in ("skipped", "placement", "engine_settings", "load_steps"):
        d[key] = [list(x) for x in d[key]]
    return d


__all__ = ["Keeper", "bench_backend", "onnxruntime_providers", "raw_engine_of"]
