"""The npurt command: devices, info, run and bench.

Every mistake a user can make (a missing file, a file that is no model, an unknown backend or device, a
dynamic model without --shape, a bad --input) ends in one line ``npurt: error: ...`` and a non-zero exit
status; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

EXIT_ERROR = 1  # the command could not do its job (engine, device, model)
EXIT_USAGE = 2  # the command line is wrong
EXIT_INTERRUPTED = 130

KNOWN_BACKENDS = ("OPENVINO", "VAIML")  # declared in pyproject.toml; AUTO tries them in this order
DEVICES = ("AUTO", "NPU", "GPU", "CPU")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: object) -> str:
    """An exception's text on one line (engines raise multi-line messages prefixed with source locations)."""
    lines = [ln.strip() for ln in str(text).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("Exception from ")]
    return " ".join(lines) if lines else str(type(text).__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"npurt: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)


# -------------------------------------------------------------------------------------------------- arguments
def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=D1,D2,...`` -> (NAME, (D1, D2, ...)); the name may itself hold '=' (the last one splits)."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 1 for d in shape):
        raise CliError(f"--shape {text!r}: expected NAME=D1,D2,... with positive integers, "
                       "for example --shape x=1,3,48,192", EXIT_USAGE)
    return name, shape


def parse_shapes(items: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, shape = parse_shape(item)
        if name in shapes:
            raise CliError(f"--shape: input {name!r} is given twice", EXIT_USAGE)
        shapes[name] = shape
    return shapes


def parse_device(text: str) -> str:
    device = text.upper()
    if device not in DEVICES:
        raise CliError(f"unknown device {text!r}; choose from {', '.join(DEVICES)}", EXIT_USAGE)
    return device


# -------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelPort:
    """A model input or output as the file declares it (dynamic dims are None)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    dim_names: tuple[str | None, ...]

    @property
    def needs_shape(self) -> bool:
        """Dynamic beyond the leading batch dim (which npurt runs as 1)."""
        return any(d is None for d in self.shape[1:])

    def shape_text(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    def suggested_flag(self) -> str:
        dims = [str(d) if d is not None else ("1" if i == 0 else f"D{i}") for i, d in enumerate(self.shape)]
        return f"--shape {self.name}={','.join(dims)}"


@dataclass(frozen=True)
class ModelFile:
    path: Path
    format: str  # "onnx" or "openvino-ir"
    inputs: tuple[ModelPort, ...]
    outputs: tuple[ModelPort, ...]


def _onnx_ports(values: Sequence[Any], skip: set[str]) -> tuple[ModelPort, ...]:
    from onnx import helper

    ports = []
    for v in values:
        if v.name in skip:
            continue
        tensor = v.type.tensor_type
        try:
            dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
        except Exception:  # noqa: BLE001 - an exotic type is shown by its ONNX number
            dtype = f"onnx type {tensor.elem_type}"
        dims, names = [], []
        for d in tensor.shape.dim:
            has_value = d.HasField("dim_value") and d.dim_value > 0
            dims.append(int(d.dim_value) if has_value else None)
            names.append(d.dim_param or None)
        ports.append(ModelPort(v.name, dtype, tuple(dims), tuple(names)))
    return tuple(ports)


def read_model_file(path: Path) -> ModelFile:
    """Check that ``path`` is a model npurt can read (ONNX, or OpenVINO IR .xml) and list its ports."""
    if not path.exists():
        raise CliError(f"model file not found: {path}")
    if path.is_dir():
        raise CliError(f"{path} is a directory, not a model file")
    if not os.access(path, os.R_OK):
        raise CliError(f"cannot read model file {path}: permission denied")
    if path.suffix.lower() == ".xml":
        return _read_openvino_ir(path)
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise CliError(f"{path} is not a model: not an ONNX file ({one_line(e)}); npurt reads ONNX (.onnx) and "
                       "OpenVINO IR (.xml) models") from None
    if not model.ir_version or not model.graph.node:
        raise CliError(f"{path} is not a model: it parses as an empty ONNX protobuf (no IR version or no nodes); "
                       "npurt reads ONNX (.onnx) and OpenVINO IR (.xml) models")
    initializers = {i.name for i in model.graph.initializer}
    return ModelFile(path, "onnx", _onnx_ports(model.graph.input, initializers), _onnx_ports(model.graph.output, set()))


def _read_openvino_ir(path: Path) -> ModelFile:
    import xml.etree.ElementTree as ET

    import openvino as ov

    # Checked here first: on a file that is no IR, OpenVINO tries every frontend and some print to stderr.
    try:
        root = next(ET.iterparse(path, events=("start",)))[1].tag
    except (ET.ParseError, StopIteration) as e:
        raise CliError(f"{path} is not a model: not an XML file ({one_line(e)}); npurt reads ONNX (.onnx) and "
                       "OpenVINO IR (.xml) models") from None
    if root != "net":
        raise CliError(f"{path} is not an OpenVINO IR model: its root element is <{root}>, an IR's is <net>")
    if not path.with_suffix(".bin").is_file():
        raise CliError(f"OpenVINO IR {path} needs its weights file {path.with_suffix('.bin')}, which is missing")

    try:
        model = ov.Core().read_model(str(path))
    except Exception as e:  # noqa: BLE001
        raise CliError(f"{path} is not a model OpenVINO can read: {one_line(e)}") from None

    def ports(values: Sequence[Any]) -> tuple[ModelPort, ...]:
        out = []
        for p in values:
            shape = tuple(None if d.is_dynamic else d.get_length() for d in p.get_partial_shape())
            out.append(ModelPort(p.get_any_name(), p.get_element_type().get_type_name(), shape,
                                 (None,) * len(shape)))
        return tuple(out)

    return ModelFile(path, "openvino-ir", ports(model.inputs), ports(model.outputs))


def check_shapes(model: ModelFile, shapes: dict[str, tuple[int, ...]], given_by: str = "--shape") -> None:
    """--shape names real inputs with a fitting rank and dims."""
    by_name = {p.name: p for p in model.inputs}
    for name, shape in shapes.items():
        port = by_name.get(name)
        if port is None:
            raise CliError(f"{given_by} {name}=...: the model has no input {name!r} (its inputs: "
                           f"{', '.join(by_name) or 'none'})", EXIT_USAGE)
        if len(shape) != len(port.shape) or any(d is not None and d != g for d, g in zip(port.shape, shape)):
            raise CliError(f"{given_by} {name}={','.join(map(str, shape))} does not fit input {name!r} of shape "
                           f"{port.shape_text()}", EXIT_USAGE)


def require_static(model: ModelFile, shapes: dict[str, tuple[int, ...]]) -> None:
    """A model with dynamic dims (beyond the batch) needs --shape for each such input."""
    missing = [p for p in model.inputs if p.needs_shape and p.name not in shapes]
    if missing:
        flags = " ".join(p.suggested_flag() for p in missing)
        what = "; ".join(f"input {p.name!r} has dynamic dims {p.shape_text()}" for p in missing)
        raise CliError(f"{what}: give static shapes with {flags} (D<i>: the size of dim i you will feed)",
                       EXIT_USAGE)


# -------------------------------------------------------------------------------------------------- backends
def installed_backends() -> dict[str, Any]:
    from .factory import RunnerFactory

    return RunnerFactory.available_backends()


def no_backend_message() -> str:
    from .factory import RunnerFactory

    errors = RunnerFactory.backend_errors()
    detail = "; ".join(f"{n} failed to load: {one_line(e)}" for n, e in sorted(errors.items()))
    return "no npurt backend is installed" + (f" ({detail})" if detail else "") + \
        "; 'npurt devices' shows what this machine has"


def resolve_backend(text: str) -> str:
    """A backend name the factory knows (or AUTO), else a clear error naming the choices."""
    from .factory import RunnerFactory

    name = text.upper()
    classes = installed_backends()
    errors = RunnerFactory.backend_errors()
    if name == "AUTO":
        if not classes:
            raise CliError(no_backend_message())
        return name
    if name in classes:
        return name
    if name in errors:
        raise CliError(f"backend {name} is installed but failed to load: {one_line(errors[name])}")
    choices = sorted(set(KNOWN_BACKENDS) | set(classes))
    if name in KNOWN_BACKENDS:
        raise CliError(f"backend {name} is not installed (installed: {', '.join(sorted(classes)) or 'none'})")
    raise CliError(f"unknown backend {text!r}; choose from {', '.join(c.lower() for c in choices)} or auto",
                   EXIT_USAGE)


def auto_order() -> list[tuple[str, bool]]:
    """The order AUTO tries backends in, each with whether it sees its NPU (as RunnerFactory's AUTO does)."""
    classes = installed_backends()
    ordered = [n for n in KNOWN_BACKENDS if n in classes] + sorted(n for n in classes if n not in KNOWN_BACKENDS)
    npu = {}
    for n in ordered:
        try:
            npu[n] = bool(classes[n].npu_present())
        except Exception:  # noqa: BLE001
            npu[n] = False
    return [(n, True) for n in ordered if npu[n]] + [(n, False) for n in ordered if not npu[n]]


@dataclass
class Loaded:
    runner: Any
    backend: str
    load_ms: float
    notes: list[str]  # fallbacks and backend choices, with their reasons


def create_runner(backend: str, model: Path, options: dict[str, Any]) -> Loaded:
    """Create a runner; for AUTO try the backends one by one so every skipped one comes with its reason."""
    from .factory import RunnerFactory
    from .types import NpuFallbackWarning

    if backend == "VAIML" and model.suffix.lower() == ".xml":
        raise CliError(f"backend VAIML (ONNX Runtime) reads ONNX models only; {model} is an OpenVINO IR model "
                       "(use --backend openvino)", EXIT_USAGE)

    order = auto_order() if backend == "AUTO" else [(backend, False)]
    names = [n for n, _ in order]
    failures = []
    for name, sees_npu in order:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NpuFallbackWarning)
            t0 = time.perf_counter()
            try:
                runner = RunnerFactory.create_runner(name, model, options)
            except ValueError as e:
                raise CliError(one_line(e), EXIT_USAGE) from e
            except Exception as e:  # noqa: BLE001 - the next backend may do; report all at the end
                failures.append((name, one_line(e)))
                continue
            load_ms = (time.perf_counter() - t0) * 1e3
        notes: list[str] = []
        if backend == "AUTO":
            notes.append(f"chosen by --backend auto: {name} sees its NPU" if sees_npu else
                         f"chosen by --backend auto: no installed backend sees an NPU; {name} is the first of "
                         f"{', '.join(names)} that loads the model")
        notes += [f"{n} could not load the model: {why}" for n, why in failures]
        for w in caught:
            if not issubclass(w.category, NpuFallbackWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            elif not runner.device_info.fell_back:  # else describe_device() says it, with the reason
                notes.append(f"fallback: {one_line(w.message)}")
        return Loaded(runner, name, load_ms, notes)
    if len(failures) == 1:
        raise CliError(f"{failures[0][0]} cannot load {model}: {failures[0][1]}")
    raise CliError(f"no backend could load {model}: " + "; ".join(f"{n}: {why}" for n, why in failures))


def runner_options(args: argparse.Namespace, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    options: dict[str, Any] = {"device": args.device, "fallback": args.fallback}
    if shapes:
        options["shapes"] = {n: list(s) for n, s in shapes.items()}
    if getattr(args, "tensor_type", None):
        options["input_tensor_type"] = options["output_tensor_type"] = args.tensor_type
    if getattr(args, "hint", None):
        options["performance_hint"] = args.hint
    return options


def describe_device(runner: Any) -> list[str]:
    info = runner.device_info
    lines = [f"{info.engine} {info.engine_version} on {info.attached}" + (f" ({info.full_name})" if info.full_name
                                                                          else "")]
    if info.fell_back:
        lines.append(f"fell back: asked for {info.requested}, running on {info.attached}: {info.reason}")
    elif info.requested != info.attached:
        for device, why in info.skipped:
            lines.append(f"{info.requested} skipped {device}: {why}")
    if info.placement:
        lines.append("nodes per provider: " + ", ".join(f"{p}: {n}" for p, n in info.placement))
    return lines


def model_label(path: Path, embedded: bool) -> str:
    return f"{path.name} (the embedded default model: 1x3x64x64 image -> 10 class scores)" if embedded else str(path)


# -------------------------------------------------------------------------------------------------- devices
def cmd_devices(args: argparse.Namespace) -> int:
    from .devices import discover

    report = discover()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from . import __version__

    out: list[str] = [f"npurt {__version__}: {report['verdict']}", ""]
    out.append("npurt backends")
    for name, b in report["backends"]["installed"].items():
        out.append(f"  {name:<10} installed; sees its NPU: {'yes' if b['npu_present'] else 'no'}")
    for name, err in report["backends"]["failed"].items():
        out.append(f"  {name:<10} not available: {one_line(err)}")
    if not report["backends"]["installed"] and not report["backends"]["failed"]:
        out.append("  none registered")
    ov = report["openvino"]
    out.append("")
    if ov["installed"]:
        out.append(f"OpenVINO {ov['version']}")
        for d in ov["devices"]:
            out.append(f"  {d['name']:<10} {d['full_name'] or d.get('error', '')}")
        for plugin, st in ov["plugins"].items():
            if st["devices"]:
                out.append(f"  {plugin} plugin: devices {', '.join(st['devices'])}")
            else:
                out.append(f"  {plugin} plugin: {'loaded, ' if st['loaded'] else ''}no device: {st['why_not']}")
    else:
        out.append(f"OpenVINO: {ov['error']}")
    ort = report["onnxruntime"]
    out.append("")
    if ort["installed"]:
        out.append(f"ONNX Runtime {ort['version']}")
        out.append(f"  providers  {', '.join(ort['providers'])}")
        out.append("  Vitis AI   " + ("VitisAIExecutionProvider installed" if ort["vitis_ai"] else
                                      f"not installed: {ort['why_not']}"))
    else:
        out.append(f"ONNX Runtime: {ort['error']}")
    k = report["kernel"]
    out.append("")
    out.append("Kernel")
    nodes = [f"{n['path']} ({n['driver'] or 'driver unknown'}{'' if n['accessible'] else ', no access'})"
             for n in k["accel_nodes"]]
    out.append(f"  /dev/accel     {', '.join(nodes) if nodes else 'no accel device nodes'}")
    out.append("  NPU drivers    " + "; ".join(f"{n}: {'loaded' if d['loaded'] else 'not loaded'}"
                                               for n, d in k["npu_drivers"].items()))
    heaps = [f"{h['name']}{'' if h['accessible'] else ' (no access)'}" for h in k["dma_heaps"]]
    out.append(f"  DMA-BUF heaps  {', '.join(heaps) if heaps else 'none (/dev/dma_heap is absent)'}")
    u = k["udmabuf"]
    out.append("  udmabuf        " + ("/dev/udmabuf" + ("" if u["accessible"] else " (no access)") if u["present"]
                                      else "absent (/dev/udmabuf; module udmabuf not loaded)"))
    out.append(f"  memfd          {'yes' if k['memfd'] else 'no'}")
    m = report["memory"]
    out.append("")
    out.append(f"Memory: \"auto\" allocation uses {m['actual'] or m['expected']}"
               + (f" ({m['note']})" if m["note"] else ""))
    if report["needed"]:
        out.append("")
        out.append("To use an NPU, this machine would need:")
        out += [f"  - {n}" for n in report["needed"]]
    print("\n".join(out))
    return 0


# -------------------------------------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    from .types import TensorDirection, TensorType

    path = Path(args.model)
    model = read_model_file(path)
    shapes = parse_shapes(args.shape)
    check_shapes(model, shapes)
    device = parse_device(args.device)
    backend = resolve_backend(args.backend)
    out = [f"Model    {path} ({model.format})"]
    dynamic = [p for p in model.inputs if p.needs_shape and p.name not in shapes]
    if dynamic:
        # Without static shapes no backend compiles the model: show what the file says and how to fix it.
        out.append("Inputs (as the file declares them)")
        for p in model.inputs:
            out.append(f"  {p.name:<16} {p.shape_text()} {p.dtype}")
        out.append("Outputs (as the file declares them)")
        for p in model.outputs:
            out.append(f"  {p.name:<16} {p.shape_text()} {p.dtype}")
        out.append("")
        for p in dynamic:
            dims = [f"dim {i}" + (f" ({n})" if n and n != "?" else "") for i, (d, n) in
                    enumerate(zip(p.shape, p.dim_names or (None,) * len(p.shape))) if d is None and i > 0]
            out.append(f"Input {p.name!r} has dynamic {', '.join(dims)}: to compile it (and see its CPU and HW views) "
                       f"add {p.suggested_flag()} with D<i> the size of dim i you will feed")
        print("\n".join(out))
        return 0
    loaded = create_runner(backend, path, {"device": device, "fallback": args.fallback,
                                           **({"shapes": {n: list(s) for n, s in shapes.items()}} if shapes else {})})
    runner = loaded.runner
    try:
        out.append(f"Backend  {loaded.backend}")
        out += [f"         {n}" for n in loaded.notes]
        out.append("Device   " + "\n         ".join(describe_device(runner)))
        out.append("Ports    take the HW view by default: a tensor in the port's view goes to the engine without a "
                   "copy, one in the other view is converted (options input_tensor_type / output_tensor_type)")
        for direction, specs, label in ((TensorDirection.INPUT, runner.input_specs, "Inputs"),
                                        (TensorDirection.OUTPUT, runner.output_specs, "Outputs")):
            cpu = runner.get_tensors_info(direction, TensorType.CPU)
            hw = runner.get_tensors_info(direction, TensorType.HW)
            by_spec = {s.name: s for s in specs}
            out.append(f"{label} ({len(cpu)})")
            for c, h in zip(cpu, hw):
                spec = by_spec.get(c.name)
                out.append(f"  {c.name}")
                if spec is not None:
                    model_shape = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
                    line = f"    model     {model_shape} {spec.data_type.name}"
                    if not spec.is_static:
                        given = shapes.get(c.name)
                        line += (f"  (dynamic {', '.join(spec.dynamic_dims())}: fixed by --shape)" if given else
                                 f"  (dynamic {', '.join(spec.dynamic_dims())}: run as batch 1)")
                    out.append(line)
                out.append(f"    CPU view  {_view(c)}")
                out.append(f"    HW view   {_view(h)}")
                quant = runner.get_quant_parameters(c.name)
                out.append("    quant     " + (f"scale {quant.scale:g}, zero point {quant.zero_point}, "
                                                f"{quant.rounding_mode.name}" if quant else "none (float)"))
    finally:
        runner.close()
    print("\n".join(out))
    return 0


def _view(info: Any) -> str:
    text = f"{list(info.shape)} {info.data_type.name} {info.memory_layout.name}"
    if info.memory_layout_order:
        text += f" order {list(info.memory_layout_order)}"
    if not info.is_contiguous:
        text += f" strides {list(info.strides)}"
    return text + f", {info.size_in_bytes} bytes"


# -------------------------------------------------------------------------------------------------- run
def parse_inputs(items: Sequence[str] | None, model: ModelFile) -> dict[str, np.ndarray]:
    """--input NAME=file.npy, checked against the model's inputs (name, rank and declared dims, dtype)."""
    by_name = {p.name: p for p in model.inputs}
    arrays: dict[str, np.ndarray] = {}
    for item in items or ():
        name, sep, file = item.rpartition("=")
        if not sep or not name or not file:
            raise CliError(f"--input {item!r}: expected NAME=file.npy", EXIT_USAGE)
        port = by_name.get(name)
        if port is None:
            raise CliError(f"--input {item}: the model has no input {name!r} (its inputs: {', '.join(by_name)})",
                           EXIT_USAGE)
        if name in arrays:
            raise CliError(f"--input: input {name!r} is given twice", EXIT_USAGE)
        path = Path(file)
        if not path.is_file():
            raise CliError(f"--input {item}: file not found: {path}")
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            raise CliError(f"--input {item}: {path} is not a .npy file (save the array with numpy.save)")
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001
            raise CliError(f"--input {item}: {path} is not a readable .npy array ({one_line(e)})") from None
        if port.dtype != str(arr.dtype):
            raise CliError(f"--input {item}: dtype {arr.dtype}, expected {port.dtype} for input {name!r} (convert it "
                           f"with arr.astype(np.{port.dtype}))")
        if arr.ndim != len(port.shape) or any(d is not None and d != a for d, a in zip(port.shape, arr.shape)):
            raise CliError(f"--input {item}: shape {list(arr.shape)}, expected {port.shape_text()} for input "
                           f"{name!r}")
        arrays[name] = arr
    return arrays


def summarize_output(name: str, arr: np.ndarray) -> str:
    text = f"  {name:<12} {list(arr.shape)} {arr.dtype}"
    if arr.size == 0:
        return text + "  (empty)"
    if np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_:
        a = arr.astype(np.float64)
        text += f"  min {a.min():.6g}  max {a.max():.6g}  mean {a.mean():.6g}"
        scores = arr.reshape(-1) if arr.ndim == 1 or (arr.ndim == 2 and arr.shape[0] == 1) else None
        if scores is not None and scores.size > 1 and np.issubdtype(arr.dtype, np.floating):
            best = int(np.argmax(scores))
            text += f"  argmax {best} ({float(scores[best]):.6g})"
        elif arr.ndim == 2 and arr.shape[1] > 1 and np.issubdtype(arr.dtype, np.floating):
            text += f"  argmax per row {np.argmax(arr, axis=1).tolist()[:16]}"
    return text


def model_and_shapes(args: argparse.Namespace) -> tuple[bool, Path, Any, dict[str, tuple[int, ...]]]:
    """The model `run` and `bench` take (the embedded default when none is given) and its checked --shape flags."""
    from .models import default_model_path

    embedded = args.model is None
    path = default_model_path() if embedded else Path(args.model)
    model = read_model_file(path)
    shapes = parse_shapes(args.shape)
    check_shapes(model, shapes)
    return embedded, path, model, shapes


def cmd_run(args: argparse.Namespace) -> int:
    from .bench import random_array, summarize_ms
    from .types import TensorType

    embedded, path, model, shapes = model_and_shapes(args)
    given = parse_inputs(args.input, model)
    for name, arr in given.items():  # a dynamic input's shape can come from its file
        port = next(p for p in model.inputs if p.name == name)
        if name in shapes and tuple(arr.shape) != shapes[name]:
            raise CliError(f"--input {name}=...: shape {list(arr.shape)} differs from --shape "
                           f"{name}={','.join(map(str, shapes[name]))}", EXIT_USAGE)
        if not all(d is not None for d in port.shape):
            shapes.setdefault(name, tuple(arr.shape))
    require_static(model, shapes)
    if args.output is not None and not Path(args.output).resolve().parent.is_dir():
        raise CliError(f"--output {args.output}: directory {Path(args.output).resolve().parent} does not exist")
    backend = resolve_backend(args.backend)
    loaded = create_runner(backend, path, runner_options(args, shapes))
    runner = loaded.runner
    try:
        cpu_inputs = runner.get_tensors_info(0, TensorType.CPU)
        rng = np.random.default_rng(args.seed)
        feeds, sources = {}, []
        for info in cpu_inputs:
            if info.name in given:
                feeds[info.name] = given[info.name]
                source = args_input_file(args, info.name)
                sources.append(f"{info.name} {list(info.shape)} {info.numpy_dtype} from {source}")
            else:
                feeds[info.name] = random_array(info.shape, info.numpy_dtype, rng)
                sources.append(f"{info.name} {list(info.shape)} {info.numpy_dtype} random (seed {args.seed})")
        t0 = time.perf_counter()
        results = runner.run(feeds)
        first_ms = (time.perf_counter() - t0) * 1e3
        samples = []
        for _ in range(args.repeat):
            t0 = time.perf_counter_ns()
            runner.run(feeds)
            samples.append(time.perf_counter_ns() - t0)
        out = [f"Model     {model_label(path, embedded)}",
               f"Backend   {loaded.backend} ({type(runner).__module__}.{type(runner).__qualname__})"]
        out += [f"          {n}" for n in loaded.notes]
        out.append("Device    " + "\n          ".join(describe_device(runner)))
        out.append("Inputs    " + "\n          ".join(sources))
        out.append("Outputs")
        out += [summarize_output(name, arr) for name, arr in results.items()]
        lat = f"load + compile {loaded.load_ms:.1f} ms, first inference {first_ms:.2f} ms"
        if samples:
            s = summarize_ms(samples)
            lat += f", then p50 {s['p50']:.3f} ms (min {s['min']:.3f}, max {s['max']:.3f}) over {s['count']} runs"
        out.append(f"Latency   {lat}")
        if args.output is not None:
            np.savez(args.output, **results)
            out.append(f"Saved     {', '.join(results)} to {args.output}")
    finally:
        runner.close()
    print("\n".join(out))
    return 0


def args_input_file(args: argparse.Namespace, name: str) -> str:
    for item in args.input or ():
        n, _, f = item.rpartition("=")
        if n == name:
            return f
    return "?"


# -------------------------------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    from . import __version__
    from .bench import Budget, Progress, bench_runner
    from .types import NpuFallbackWarning, TensorType

    embedded, path, model, shapes = model_and_shapes(args)
    require_static(model, shapes)
    device = parse_device(args.device)
    if args.niter is not None and args.niter < 1:
        raise CliError(f"--niter {args.niter}: must be at least 1", EXIT_USAGE)
    if args.time is not None and not args.time > 0:
        raise CliError(f"--time {args.time}: must be more than 0 seconds", EXIT_USAGE)
    if args.requests < 1:
        raise CliError(f"--requests {args.requests}: must be at least 1", EXIT_USAGE)
    if args.warmup < 0:
        raise CliError(f"--warmup {args.warmup}: must be 0 or more", EXIT_USAGE)
    which = args.backend.upper()
    if which == "BOTH":
        backends = [b for b in KNOWN_BACKENDS if b in installed_backends()]
        if not backends:
            raise CliError(no_backend_message())
        missing = [b for b in KNOWN_BACKENDS if b not in backends]
    else:
        backends, missing = [resolve_backend(args.backend)], []
        if backends == ["AUTO"]:
            raise CliError("bench measures named backends: use --backend openvino, vaiml or both", EXIT_USAGE)
    time_s = args.time if args.time is not None else (None if args.niter is not None else 3.0)
    budget = Budget(niter=args.niter, time_s=time_s, warmup=args.warmup)
    progress = Progress(enabled=not args.no_progress)
    tensor_type = None if args.tensor_type == "AUTO" else TensorType[args.tensor_type]
    options = runner_options(args, shapes)
    options.pop("input_tensor_type", None)
    options.pop("output_tensor_type", None)
    report: dict[str, Any] = {
        "npurt_version": __version__, "model": str(path), "embedded_model": embedded,
        "settings": {"device": device, "shapes": {n: list(s) for n, s in shapes.items()}, "niter": args.niter,
                     "time_s": time_s, "warmup": args.warmup, "requests": args.requests,
                     "tensor_type": args.tensor_type, "performance_hint": args.hint, "cache_dir": args.cache_dir,
                     "compare_raw": args.compare_raw, "seed": args.seed},
        "not_installed": {b: "not installed" for b in missing},
        "results": [],
    }
    dynamic = any(p.needs_shape or p.shape[:1] == (None,) for p in model.inputs)
    for name in backends:
        cache = Path(args.cache_dir) / name.lower() if args.cache_dir else None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", NpuFallbackWarning)
                entry = bench_runner(name, path, options, budget, args.requests, seed=args.seed, cache_dir=cache,
                                     tensor_type=tensor_type, raw="auto" if args.compare_raw else None,
                                     raw_shapes=_static_input_shapes(model, shapes) if dynamic else None,
                                     performance_hint=args.hint, progress=progress)
        except ValueError as e:
            raise CliError(one_line(e), EXIT_USAGE) from e
        except Exception as e:
            if args.debug:
                raise
            raise CliError(f"{name} on {path.name}: {one_line(e)}") from e
        entry = {"backend": name, **entry,
                 "fallbacks": sorted({one_line(w.message) for w in caught
                                      if issubclass(w.category, NpuFallbackWarning)})}
        report["results"].append(entry)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_bench(report, embedded))
    return 0


def _get(res: dict[str, Any] | None, *keys: str) -> float | None:
    cur: Any = res
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def _static_input_shapes(model: ModelFile, shapes: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """Every input's static shape as npurt compiles it: --shape, else the model's with a dynamic batch dim as 1."""
    return {p.name: list(shapes.get(p.name) or [1 if d is None else d for d in p.shape]) for p in model.inputs}


def format_bench(report: dict[str, Any], embedded: bool) -> str:
    s = report["settings"]
    budget = " or ".join(x for x in ((f"{s['niter']} iterations" if s["niter"] else ""),
                                     (f"{s['time_s']:g} s" if s["time_s"] else "")) if x)
    out = [f"Model     {model_label(Path(report['model']), embedded)}",
           f"Settings  device {s['device']}, tensors allocated by the runner, {budget} per "
           f"measurement after {s['warmup']} warm-up runs, {s['requests']} async requests"
           + (f", hint {s['performance_hint']}" if s["performance_hint"] else "")]
    for name, why in report["not_installed"].items():
        out.append(f"          {name}: {why}")
    for entry in report["results"]:
        r, raw = entry["npurt"], entry["raw"]
        d = r["device_info"]
        out.append("")
        out.append(f"{entry['backend']}: {d['engine']} {d['engine_version'].split('-')[0]} on {d['attached']}"
                   + (f" ({d['full_name']})" if d["full_name"] else "") + f", {r['tensor_type']} views")
        for f in entry["fallbacks"]:
            out.append(f"  fallback: {f}")
        if r.get("raw_missing"):
            out.append(f"  no raw comparison: {r['raw_missing']}")
        if raw is not None:
            out.append(f"  raw engine call: {raw['call']}"
                       + (f" {raw['config']}" if raw.get("config") else "")
                       + (f" {raw['providers']}" if raw.get("providers") else ""))
        out.append(f"  {'':<34}{'npurt':>12}" + (f"{'raw':>12}{'npurt/raw':>11}" if raw else ""))

        def row(label: str, a: float | None, b: float | None, fmt: str = "{:.3f}", raw: Any = raw) -> None:
            text = f"  {label:<34}{(fmt.format(a) if a is not None else '-'):>12}"
            if raw is not None:
                text += f"{(fmt.format(b) if b is not None else '-'):>12}"
                text += f"{(f'{a / b:.2f}' if a is not None and b else '-'):>11}"
            out.append(text)

        row("load + compile (ms)", r["load_ms"], _get(raw, "load_ms"), "{:.1f}")
        row("first inference (ms)", r["first_inference_ms"], _get(raw, "first_inference_ms"), "{:.2f}")
        if "cache" in r:
            row("load from cache (ms)", r["cache"]["cached_load_ms"], _get(raw, "cache", "cached_load_ms"), "{:.1f}")
        for k in ("min", "p50", "p90", "p99", "max"):
            row(f"latency {k} (ms)", r["latency_ms"][k], _get(raw, "latency_ms", k))
        row(f"throughput (inferences/s, {r['throughput']['requests']} req)", r["throughput"]["fps"],
            _get(raw, "throughput", "fps"), "{:.1f}")
        out.append(f"  {r['latency_ms']['count']} timed executes, {r['throughput']['count']} async jobs; host copies "
                   f"per execute: {r['copies_per_inference']:g}")
    return "\n".join(out)


# -------------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks instead of one-line errors")

    def model_options(p: argparse.ArgumentParser, backends: str, default_backend: str) -> None:
        p.add_argument("--backend", default=default_backend, metavar="NAME",
                       help=f"{backends} (default: {default_backend})")
        p.add_argument("--device", default="AUTO", metavar="DEVICE",
                       help="AUTO (NPU, then GPU, then CPU), NPU, GPU or CPU (default: AUTO)")
        p.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                       help="a static shape for an input with dynamic dims (repeatable), e.g. --shape x=1,3,48,192")
        p.add_argument("--fallback", choices=("cpu", "error"), default="cpu",
                       help="when the device asked for is absent: run on CPU and say so (default), or fail")

    parser = _Parser(prog="npurt", parents=[common],
                     description="npurt: one VART-ML style runtime for NPUs, over OpenVINO and ONNX Runtime.")
    parser.add_argument("--version", action="version",
                        version=f"npurt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("devices", parents=[common], help="what this machine has, per backend, and why no NPU",
                       description="Report the engines, their devices and the NPU plugin state, the kernel's "
                                   "accel nodes and NPU drivers, DMA-BUF heaps and udmabuf, and which memory "
                                   "provider npurt's allocation uses.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("info", parents=[common], help="a model's inputs and outputs, in the CPU and HW views",
                       description="Show a model's inputs and outputs as the file declares them and, compiled for "
                                   "a backend and device, in both views (shape, dtype, layout, quantization).")
    p.add_argument("model", metavar="MODEL", help="an ONNX (.onnx) or OpenVINO IR (.xml) model")
    model_options(p, "openvino, vaiml or auto", "auto")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("run", parents=[common], help="run a model once (the embedded default without MODEL)",
                       description="Run a model (without MODEL: the embedded default image model) and show where "
                                   "it ran, its outputs and the latency.")
    p.add_argument("model", metavar="MODEL", nargs="?", help="an ONNX or OpenVINO IR model (default: embedded)")
    model_options(p, "openvino, vaiml or auto", "auto")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file "
                   "(repeatable); inputs not given are random")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--output", metavar="OUT.npz", help="save the outputs to a .npz file")
    p.add_argument("--repeat", type=int, default=10, metavar="N",
                   help="runs after the first one, for the latency (default: 10)")
    p.add_argument("--tensor-type", choices=("HW", "CPU", "hw", "cpu"), default=None,
                   help="the view the runner's ports take (default: the runner's, HW)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", parents=[common], help="latency and throughput, optionally against the raw engines",
                       description="Measure time to first inference, execute latency and execute_async "
                                   "throughput for one or both backends; with --compare-raw the same figures for "
                                   "the engine called directly on the same model, in the same run.")
    p.add_argument("model", metavar="MODEL", nargs="?", help="an ONNX or OpenVINO IR model (default: embedded)")
    model_options(p, "openvino, vaiml or both", "both")
    p.add_argument("--niter", type=int, metavar="N", help="iterations per measurement")
    p.add_argument("--time", type=float, metavar="S",
                   help="seconds per measurement (default: 3, or unbounded when --niter is given)")
    p.add_argument("--warmup", type=int, default=5, metavar="N", help="warm-up runs before timing (default: 5)")
    p.add_argument("--requests", type=int, default=2, metavar="N",
                   help="async requests in flight for the throughput (default: 2)")
    p.add_argument("--compare-raw", action="store_true",
                   help="measure the raw engine (OpenVINO / ONNX Runtime called directly) in the same run")
    p.add_argument("--cache-dir", metavar="DIR", help="also time the load from a compiled-model cache in DIR")
    p.add_argument("--hint", choices=("LATENCY", "THROUGHPUT", "latency", "throughput"),
                   help="the engine's performance hint, for npurt and the raw engine alike")
    p.add_argument("--tensor-type", choices=("AUTO", "HW", "CPU", "auto", "hw", "cpu"), default="AUTO",
                   help="the view of the ports and runner-allocated tensors; AUTO (default): HW on an NPU, else CPU "
                        "(on other devices the HW view only adds a conversion the raw engine does not do)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "hint", None):
        args.hint = args.hint.upper()
    if getattr(args, "tensor_type", None):
        args.tensor_type = args.tensor_type.upper()
    args.debug = getattr(args, "debug", False)
    try:
        if hasattr(args, "device"):
            args.device = parse_device(args.device)
        return int(args.func(args))
    except CliError as e:
        if args.debug:
            raise
        print(f"npurt: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("npurt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - a user sees one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"npurt: error: {type(e).__name__}: {one_line(e)} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
