"""What the commands share: one-line errors, the model and its --shape flags, backends, runners, device lines.

Nothing here re-derives what the library knows: model inspection is ``npurt.modelinfo``, the AUTO order and its
reasons ``npurt.factory``, device names ``npurt.options``; this module turns their answers and errors into flags'
values and one-line messages.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..modelinfo import ModelDeclaration, ModelFileError, check_input_shapes, inspect_model

EXIT_ERROR = 1  # the command could not do its job (engine, device, model)
EXIT_USAGE = 2  # the command line is wrong

CACHE_DIR_ENV = "NPURT_CACHE_DIR"


def default_cache_dir() -> Path:
    """npurt's cache directory (option cache_dir) where a command gives none: ``$NPURT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/npurt/compiled``, else ``~/.cache/npurt/compiled`` (``npurt cache`` lists the same; the test
    models of ``npurt.models.zoo`` go beside it, in ``models``)."""
    if explicit := os.environ.get(CACHE_DIR_ENV):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # (a relative XDG path is ignored, per the spec)
    return root / "npurt" / "compiled"


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


FRAME_FLAG_HELP = ("INPUT=FORMAT[,key=value...]: that input takes uint8 camera / decoder frames (FORMAT: BGR, RGB, "
                   "GRAY, NV12), keys model_color=RGB|BGR, model_size=HxW, resize=linear|nearest|none, "
                   "mean=M1/M2/M3, std=S1/S2/S3 (pixel units), frame_size=HxW; e.g. --frame "
                   "x=BGR,model_size=48x192,mean=127.5,std=127.5")


def parse_frame(text: str) -> tuple[str, dict[str, Any]]:
    """``INPUT=FORMAT[,key=value...]`` -> (INPUT, the option ``frames`` spec of that input)."""
    name, sep, rest = text.partition("=")
    parts = rest.split(",")
    if not sep or not name or not parts[0]:
        raise CliError(f"--frame {text!r}: expected {FRAME_FLAG_HELP}", EXIT_USAGE)
    spec: dict[str, Any] = {"format": parts[0]}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        try:
            if not eq:
                raise ValueError
            if key in ("model_size", "frame_size"):
                spec[key] = [int(v) for v in value.lower().split("x")]
            elif key in ("mean", "std"):
                spec[key] = [float(v) for v in value.split("/")]
            elif key == "resize":
                spec[key] = None if value.lower() == "none" else value
            elif key == "model_color":
                spec[key] = value
            else:
                raise ValueError
        except ValueError:
            raise CliError(f"--frame {text!r}: cannot read {part!r}; expected {FRAME_FLAG_HELP}", EXIT_USAGE) from None
    return name, spec


def parse_device(text: str) -> str:
    """A device name the runner's options accept (``npurt.options.DEVICES``)."""
    from ..options import DEVICES

    device = text.upper()
    if device not in DEVICES:
        raise CliError(f"unknown device {text!r}; choose from {', '.join(DEVICES)}", EXIT_USAGE)
    return device


def add_model_options(p: argparse.ArgumentParser, backends: str, default_backend: str, *,
                      decoder: bool = False) -> None:
    """The flags every command that loads a model takes (``decoder``: those that apply to a decoder only: its
    shapes, views and frames are derived, so --shape, --frame and --hw-view are not offered)."""
    p.add_argument("--backend", default=default_backend, metavar="NAME", help=f"{backends} (default: "
                   f"{default_backend})")
    p.add_argument("--device", default="AUTO", metavar="DEVICE",
                   help="AUTO (NPU, then GPU, then CPU), NPU, GPU or CPU (default: AUTO)")
    p.add_argument("--fallback", choices=("cpu", "error"), default="cpu",
                   help="when the device asked for is absent: run on CPU and say so (default), or fail")
    p.add_argument("--engine-option", action="append", metavar="KEY=VALUE",
                   help="option engine_options (repeatable), for every backend tried: an OpenVINO property, e.g. "
                        "ENABLE_CPU_PINNING=NO, or an ONNX Runtime session option, config entry (area.key) or "
                        "Vitis AI / QNN EP option; a backend that has no such option refuses it")
    if decoder:
        return
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                   help="pin an input's shape (repeatable), e.g. --shape x=1,3,48,192: the engine is compiled for "
                        "exactly that shape (without it, dynamic dims stay dynamic where the device allows)")
    p.add_argument("--frame", action="append", metavar="INPUT=FORMAT[,key=value...]", help=FRAME_FLAG_HELP)
    p.add_argument("--hw-view", choices=("device", "npu"), default="device",
                   help="whose view the HW ports take: the attached device's (default; on CPU the model's own), "
                        "or the NPU's (FP16 NHWC / BF16 HCWNC4) wherever it runs")


def add_cache_options(p: argparse.ArgumentParser, kept: str) -> None:
    """--cache-dir DIR and --no-cache (``kept``: what the cache keeps, for the help)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cache-dir", metavar="DIR",
                       help=f"npurt's cache (option cache_dir), where {kept} are kept, so that a second load reuses "
                            f"them (default: ${CACHE_DIR_ENV}, else $XDG_CACHE_HOME/npurt/compiled, else "
                            "~/.cache/npurt/compiled)")
    group.add_argument("--no-cache", action="store_true",
                       help="keep nothing: derive, check and compile afresh on every load")


def cache_dir_of(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """The cache directory the flags ask for (None: --no-cache), and a note where the default cannot be used (a
    read-only home: the command runs without a cache rather than fail; a --cache-dir given must work)."""
    if args.no_cache:
        return None, None
    if args.cache_dir:
        path = Path(args.cache_dir).expanduser()
        if path.exists() and not path.is_dir():
            raise CliError(f"--cache-dir {args.cache_dir}: not a directory", EXIT_USAGE)
        return path, None
    path = default_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        return None, f"no cache: cannot write {path} ({e.strerror}); --cache-dir DIR names another"
    return path, None


# -------------------------------------------------------------------------------------------------- models
def load_model_file(path: Path) -> ModelDeclaration:
    try:
        return inspect_model(path)
    except ModelFileError as e:
        raise CliError(str(e)) from None


def pinned_shapes(args: argparse.Namespace, model: ModelDeclaration) -> dict[str, tuple[int, ...]]:
    """The --shape flags, checked against the model's inputs."""
    shapes = parse_shapes(args.shape)
    try:
        check_input_shapes(model, shapes, "--shape")
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    return shapes


def model_label(path: Path, embedded: bool) -> str:
    from ..models import DEFAULT_MODEL_DESCRIPTION

    return f"{path.name} (embedded: {DEFAULT_MODEL_DESCRIPTION})" if embedded else str(path)


def ask_for_shapes(unresolved: Sequence[Any], verb: str) -> CliError:
    """The error for inputs whose open dims nobody gave a size to."""
    what = "; ".join(f"input {p.name!r} has dynamic dims {p.shape_text()}" for p in unresolved)
    flags = " ".join(p.suggested_shape_flag() for p in unresolved)
    return CliError(f"{what}: to {verb} it give the sizes with {flags} (D<i>: the size of dim i you will feed)",
                    EXIT_USAGE)


# -------------------------------------------------------------------------------------------------- backends
def no_backend_message() -> str:
    from ..factory import RunnerFactory

    errors = RunnerFactory.backend_errors()
    detail = "; ".join(f"{n} failed to load: {one_line(e)}" for n, e in sorted(errors.items()))
    return "no npurt backend is installed" + (f" ({detail})" if detail else "") + \
        "; 'npurt devices' shows what this machine has"


def resolve_backend(text: str) -> str:
    """A backend name the factory knows (or AUTO), else a clear error naming the choices."""
    from ..factory import AUTO_ORDER, RunnerFactory

    name = text.upper()
    classes = RunnerFactory.available_backends()
    errors = RunnerFactory.backend_errors()
    if name == "AUTO":
        if not classes:
            raise CliError(no_backend_message())
        return name
    if name in classes:
        return name
    if name in errors:
        raise CliError(f"backend {name} is installed but failed to load: {one_line(errors[name])}")
    if name in AUTO_ORDER:
        raise CliError(f"backend {name} is not installed (installed: {', '.join(sorted(classes)) or 'none'})")
    choices = sorted(set(AUTO_ORDER) | set(classes))
    raise CliError(f"unknown backend {text!r}; choose from {', '.join(c.lower() for c in choices)} or auto",
                   EXIT_USAGE)


@dataclass
class Loaded:
    runner: Any
    backend: str
    load_ms: float
    notes: list[str]  # how the backend was chosen, what failed, fallbacks
    cache_dir: Path | None = None  # option cache_dir where the command set it


def engine_options(args: argparse.Namespace) -> dict[str, str]:
    """The --engine-option flags as option engine_options: values as text, which both engines parse."""
    options: dict[str, str] = {}
    for item in getattr(args, "engine_option", None) or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--engine-option {item!r}: expected KEY=VALUE", EXIT_USAGE)
        options[key.strip()] = value.strip()
    return options


def runner_options(args: argparse.Namespace, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    options: dict[str, Any] = {"device": args.device, "fallback": args.fallback, "hw_view": args.hw_view}
    if engine := engine_options(args):
        options["engine_options"] = engine
    if shapes:
        options["shapes"] = {n: list(s) for n, s in shapes.items()}
    if getattr(args, "hint", None):
        options["performance_hint"] = args.hint
    if getattr(args, "frame", None):
        options["frames"] = dict(parse_frame(item) for item in args.frame)
    return options


def create_runner(backend: str, model: Path, options: dict[str, Any]) -> Loaded:
    """Create a runner; for AUTO, say which backend and why, and why the ones tried before it failed."""
    from ..factory import AutoLoadError, RunnerFactory, create_auto
    from ..types import NpuFallbackWarning

    if backend == "VAIML" and model.suffix.lower() == ".xml":
        raise CliError(f"backend VAIML (ONNX Runtime) reads ONNX models only; {model} is an OpenVINO IR model "
                       "(use --backend openvino)", EXIT_USAGE)
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NpuFallbackWarning)
        t0 = time.perf_counter()
        try:
            if backend == "AUTO":
                runner, choice = create_auto(model, options)
                notes.append(f"chosen by --backend auto: {choice.explain()}")
                notes += [f"{n} could not load the model: {one_line(why)}" for n, why in choice.failures]
                name = choice.backend
            else:
                runner, name = RunnerFactory.create_runner(backend, model, options), backend
        except ValueError as e:
            raise CliError(one_line(e), EXIT_USAGE) from e
        except AutoLoadError as e:
            if len(e.failures) == 1:
                raise CliError(f"{e.failures[0][0]} cannot load {model}: {one_line(e.failures[0][1])}") from e
            if e.failures:
                raise CliError(f"no backend could load {model}: "
                               + "; ".join(f"{n}: {one_line(why)}" for n, why in e.failures)) from e
            raise CliError(no_backend_message()) from e
        except Exception as e:
            raise CliError(f"{backend} cannot load {model}: {one_line(e)}") from e
        load_ms = (time.perf_counter() - t0) * 1e3
    for w in caught:
        if not issubclass(w.category, NpuFallbackWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif not runner.device_info.fell_back:  # else describe_device() says it, with the reason
            notes.append(f"fallback: {one_line(w.message)}")
    return Loaded(runner, name, load_ms, notes)


def describe_device(runner: Any) -> list[str]:
    """Where the runner runs, why there, and which views and shapes are in force."""
    info = runner.device_info
    lines = [f"{info.engine} {info.engine_version.split('-')[0]} on {info.attached}"
             + (f" ({info.full_name})" if info.full_name else "")]
    if info.fell_back:
        lines.append(f"fell back: asked for {info.requested}, running on {info.attached}: {info.reason}")
    elif info.requested != info.attached:
        lines += [f"{info.requested} skipped {device}: {why}" for device, why in info.skipped]
    if info.placement:
        lines.append("nodes per provider: " + ", ".join(f"{p}: {n}" for p, n in info.placement))
    if info.hw_view == "npu":
        views = "npu (HW = the NPU's view" + (")" if info.attached == "NPU" else f", converted on {info.attached})")
    else:
        views = "device (HW = " + ("the NPU's view)" if info.attached == "NPU" else
                                   f"the model's own on {info.attached})")
    shapes = ("dynamic (one engine runs every input shape)" if info.shape_mode == "dynamic" else
              "static (one engine per input shape)")
    lines.append(f"views: {views}; shapes: {shapes}")
    return lines
