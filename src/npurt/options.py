"""Runner options: the one place where option names, defaults and valid values are known."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .types import DataType, MemoryLayout, TensorDirection, TensorType, enum_member

DEVICES = ("AUTO", "NPU", "CPU", "GPU")
FALLBACKS = ("cpu", "error")
CALLBACK_ORDERS = ("submission", "completion")
LOG_LEVELS = ("ERROR", "WARNING", "INFO", "DEBUG")
PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT")
PRECISIONS = ("f32", "f16", "bf16")
MEMORY_PROVIDERS = ("auto", "dma_heap", "udmabuf", "memfd", "host")
HW_VIEWS = ("device", "npu")
DEFAULT_MAX_COMPILED_SHAPES = 16
# The default of option num_threads where a caller gives none (a test suite caps every runner's threads with it).
NUM_THREADS_ENV = "NPURT_NUM_THREADS"

OPTION_KEYS = (
    "device", "fallback", "input_tensor_type", "output_tensor_type", "batch_size", "shapes",
    "max_concurrent_runs", "async_threadpool_depth", "callback_order", "log_level", "cache_dir",
    "performance_hint", "inference_precision", "hw_format", "engine_options", "memory_provider",
    "memory_strict", "hw_view", "max_compiled_shapes", "static_shapes", "num_threads", "state_pairs", "service",
    "execution_provider", "ep_policy", "frames", "decoder", "huge_pages",
)
MAX_DECODER_BATCH = 64  # rows of one batched step: each holds a cache of max_length rows
DECODER_KEYS = ("max_length", "prefill_chunk", "batch")
DEFAULT_PREFILL_CHUNK = 16
FRAME_FORMATS = ("BGR", "RGB", "GRAY", "NV12")
FRAME_COLORS = ("RGB", "BGR")
FRAME_RESIZES = ("linear", "nearest")
FRAME_KEYS = ("format", "model_color", "model_size", "resize", "mean", "std", "frame_size")
# ONNX Runtime's device policies (OrtExecutionProviderDevicePolicy), for option ep_policy
EP_POLICIES = ("DEFAULT", "PREFER_CPU", "PREFER_NPU", "PREFER_GPU", "MAX_PERFORMANCE", "MAX_EFFICIENCY",
               "MIN_OVERALL_POWER")
PER_TENSOR_PREFIXES = ("input_tensor_type.", "output_tensor_type.")


@dataclass(frozen=True)
class HwFormat:
    """A user's override of one tensor's HW view."""

    memory_layout: MemoryLayout | None = None
    data_type: DataType | None = None


@dataclass(frozen=True)
class FrameSpec:
    """How one model input takes camera / decoder frames (option ``frames``; see ``npurt.frames``)."""

    format: str  # "BGR", "RGB", "GRAY", "NV12"
    model_color: str = "RGB"  # the channel order the model was trained on
    model_size: tuple[int, int] | None = None  # [h, w] to resize to, where the model leaves its size open
    resize: str | None = "linear"  # "linear", "nearest", or None (the frame is the model's size)
    mean: tuple[float, ...] = ()  # in pixel units (0..255), in the model's channel order; () is 0
    std: tuple[float, ...] = ()  # likewise; () is 1
    frame_size: tuple[int, int] | None = None  # [h, w] where the device compiles static shapes (the NPU)


@dataclass(frozen=True)
class DecoderSpec:
    """A decoder's static shapes (option ``decoder``; see ``npurt.generate``): the KV cache's rows and the prompt's
    chunk."""

    max_length: int
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    batch: tuple[int, ...] = ()  # batched steps: the batch sizes compiled (the batch form, npurt.generate.batch)


@dataclass(frozen=True)
class RunnerOptions:
    device: str = "AUTO"
    fallback: str = "cpu"
    input_tensor_type: TensorType = TensorType.HW
    output_tensor_type: TensorType = TensorType.HW
    tensor_types: Mapping[tuple[TensorDirection, str], TensorType] = field(default_factory=dict)
    batch_size: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # the first signature of shape_sets
    shape_sets: tuple[Mapping[str, tuple[int, ...]], ...] = ()  # every signature given, to compile ahead
    max_concurrent_runs: int | None = None  # None: the backend's choice (the engine's optimum, else 2)
    async_threadpool_depth: int | None = None  # None: max_concurrent_runs
    callback_order: str = "submission"
    log_level: str = "INFO"
    cache_dir: Path | None = None
    performance_hint: str | None = None
    inference_precision: str | None = None
    hw_format: Mapping[str, HwFormat] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    memory_provider: str = "auto"
    memory_strict: bool = False
    hw_view: str = "device"
    max_compiled_shapes: int = DEFAULT_MAX_COMPILED_SHAPES
    static_shapes: bool | None = None  # None: as the device needs (the NPU compiles static shapes only)
    num_threads: int | None = None  # None: the engine's choice for the hint and concurrency
    state_pairs: Mapping[str, str] = field(default_factory=dict)  # input -> the output fed back as it (streams)
    service: str | None = None  # the socket of an `npurt serve` (runner type SERVICE); None: the default socket
    # RunnerType.ONNXRUNTIME: the EPs to try, in order, each with its provider options; or ONNX Runtime's policy
    execution_provider: tuple[tuple[str, Mapping[str, str]], ...] = ()
    ep_policy: str | None = None
    frames: Mapping[str, FrameSpec] = field(default_factory=dict)  # input -> how it takes camera / decoder frames
    decoder: DecoderSpec | None = None  # a decoder-only model run in its static form (npurt.generate)
    # the process's memory collapsed into huge pages once the model loaded (npurt.huge_pages); None: huge_pages.wanted
    huge_pages: bool | None = None

    def tensor_type(self, direction: TensorDirection, name: str) -> TensorType:
        """The view a port is compiled for: its per-tensor option, else the direction's option."""
        per = self.tensor_types.get((direction, name))
        if per is not None:
            return per
        return self.input_tensor_type if direction is TensorDirection.INPUT else self.output_tensor_type


def cores() -> int:
    """The CPUs this process may use (what per-run thread counts are sized by)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _choice(key: str, value: Any, valid: tuple[str, ...], upper: bool) -> str:
    if isinstance(value, str):
        v = value.upper() if upper else value.lower()
        if v in valid:
            return v
    raise ValueError(f"option {key!r}: {value!r} is not one of {', '.join(valid)}")


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option {key!r}: {value!r} is not a positive integer")
    return value


def _tensor_type(key: str, value: Any) -> TensorType:
    if isinstance(value, TensorType):
        return value
    return TensorType[_choice(key, value, ("HW", "CPU"), upper=True)]


def parse_options(options: Mapping[str, Any] | None) -> RunnerOptions:
    """Validate a user's option dict. Unknown keys and bad values raise ValueError naming the valid ones."""
    if options is None:
        options = {}
    if not isinstance(options, (dict, Mapping)):  # (dict first: an ABC's first check in a process costs ~15 us)
        raise ValueError(f"options must be a dict, got {type(options).__name__}")
    kw: dict[str, Any] = {}
    tensor_types: dict[tuple[TensorDirection, str], TensorType] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise ValueError(f"option names are strings, got {key!r}")
        if key.startswith(PER_TENSOR_PREFIXES):
            prefix, _, tensor = key.partition(".")
            if not tensor:
                raise ValueError(f"option {key!r} names no tensor")
            direction = TensorDirection.INPUT if prefix == "input_tensor_type" else TensorDirection.OUTPUT
            tensor_types[(direction, tensor)] = _tensor_type(key, value)
            continue
        if key not in OPTION_KEYS:
            raise ValueError(
                f"unknown option {key!r}; valid options: {', '.join(OPTION_KEYS)}, "
                "input_tensor_type.<tensor>, output_tensor_type.<tensor>"
            )
        if value is None:
            continue
        if key == "device":
            kw[key] = _choice(key, value, DEVICES, upper=True)
        elif key == "fallback":
            kw[key] = _choice(key, value, FALLBACKS, upper=False)
        elif key in ("input_tensor_type", "output_tensor_type"):
            kw[key] = _tensor_type(key, value)
        elif key in ("batch_size", "max_concurrent_runs", "async_threadpool_depth", "max_compiled_shapes",
                     "num_threads"):
            kw[key] = _positive_int(key, value)
        elif key == "shapes":
            kw["shape_sets"] = _parse_shape_sets(value)
            kw[key] = kw["shape_sets"][0]
        elif key == "hw_view":
            kw[key] = _choice(key, value, HW_VIEWS, upper=False)
        elif key == "state_pairs":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise ValueError(f"option 'state_pairs' maps input names to the output names fed back as them, "
                                 f"e.g. {{'state': 'stateN'}}; got {value!r}")
            kw[key] = dict(value)
        elif key in ("static_shapes", "huge_pages", "memory_strict"):
            if not isinstance(value, bool):
                raise ValueError(f"option {key!r}: {value!r} is not a bool")
            kw[key] = value
        elif key == "callback_order":
            kw[key] = _choice(key, value, CALLBACK_ORDERS, upper=False)
        elif key == "log_level":
            kw[key] = _choice(key, value, LOG_LEVELS, upper=True)
        elif key == "cache_dir":
            if not isinstance(value, (str, Path)) or not str(value):
                raise ValueError(f"option 'cache_dir': {value!r} is not a path")
            kw[key] = Path(value)
        elif key == "performance_hint":
            kw[key] = _choice(key, value, PERFORMANCE_HINTS, upper=True)
        elif key == "inference_precision":
            kw[key] = _choice(key, value, PRECISIONS, upper=False)
        elif key == "hw_format":
            kw[key] = _parse_hw_format(value)
        elif key == "engine_options":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise ValueError(f"option 'engine_options' must be a dict with string keys, got {value!r}")
            kw[key] = dict(value)
        elif key == "memory_provider":
            # "dma_heap:<heap>" names a heap other than "system" (CMA heap names vary by kernel)
            if isinstance(value, str) and value.startswith("dma_heap:") and len(value) > len("dma_heap:"):
                kw[key] = value
            else:
                kw[key] = _choice(key, value, MEMORY_PROVIDERS, upper=False)
        elif key == "service":
            if not isinstance(value, (str, Path)) or not str(value):
                raise ValueError(f"option 'service': {value!r} is not the path of an npurt service's socket")
            kw[key] = str(value)
        elif key == "execution_provider":
            kw[key] = _parse_execution_providers(value)
        elif key == "ep_policy":
            kw[key] = _choice(key, value, EP_POLICIES, upper=True)
        elif key == "frames":
            kw[key] = _parse_frames(value)
        elif key == "decoder":
            kw[key] = _parse_decoder(value)
    if "num_threads" not in kw and os.environ.get(NUM_THREADS_ENV):
        try:
            kw["num_threads"] = _positive_int(NUM_THREADS_ENV, int(os.environ[NUM_THREADS_ENV]))
        except ValueError:
            raise ValueError(f"environment variable {NUM_THREADS_ENV}={os.environ[NUM_THREADS_ENV]!r} is not a "
                             "positive integer") from None
    if kw.get("execution_provider") and kw.get("ep_policy"):
        raise ValueError("options 'execution_provider' and 'ep_policy' exclude each other: name the EPs, or let "
                         "ONNX Runtime's device policy choose")
    if kw.get("decoder") is not None:
        clashing = [k for k in ("frames", "state_pairs", "shapes") if kw.get(k)] + (
            ["batch_size"] if kw.get("batch_size", 1) != 1 else [])
        if clashing:
            raise ValueError(f"option 'decoder' excludes option {clashing[0]!r}: a decoder's shapes and state are "
                             "derived from the model (batch 1, ids in, logits out)")
    return RunnerOptions(tensor_types=tensor_types, **kw)


def _parse_decoder(value: Any) -> DecoderSpec:
    """``decoder``: {"max_length": rows of the KV cache, "prefill_chunk": tokens per prompt run (default 16),
    "batch": the batch sizes of batched steps (a list, e.g. [1, 2, 4, 8]; absent: none)}."""
    if not isinstance(value, Mapping) or "max_length" not in value:
        raise ValueError(f"option 'decoder': a dict with 'max_length' (and optionally 'prefill_chunk'), got {value!r}")
    unknown = sorted(set(value) - set(DECODER_KEYS))
    if unknown:
        raise ValueError(f"option 'decoder': unknown keys {unknown}; valid: {', '.join(DECODER_KEYS)}")
    max_length = _positive_int("decoder max_length", value["max_length"])
    chunk = _positive_int("decoder prefill_chunk", value.get("prefill_chunk", min(DEFAULT_PREFILL_CHUNK, max_length)))
    if chunk > max_length:
        raise ValueError(f"option 'decoder': prefill_chunk {chunk} is more than max_length {max_length}")
    sizes = value.get("batch", ())
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (list, tuple)):
        raise ValueError(f"option 'decoder': batch is a list of batch sizes (e.g. [1, 2, 4, 8]), got {sizes!r}")
    batch = tuple(sorted({_positive_int("decoder batch", b) for b in sizes}))
    if batch and batch[-1] > MAX_DECODER_BATCH:
        raise ValueError(f"option 'decoder': batch {batch[-1]} is more than {MAX_DECODER_BATCH}")
    return DecoderSpec(max_length, chunk, batch)


def _parse_frames(value: Any) -> dict[str, FrameSpec]:
    """``frames``: {input name: {"format": ..., "model_color", "model_size", "resize", "mean", "std", "frame_size"}}."""
    if not isinstance(value, Mapping):
        raise ValueError(f"option 'frames' maps input names to frame specs, e.g. {{'x': {{'format': 'BGR'}}}}; got "
                         f"{value!r}")
    out = {}
    for name, spec in value.items():
        where = f"option 'frames': input {name!r}"
        if not isinstance(spec, Mapping) or "format" not in spec:
            raise ValueError(f"{where}: a dict with at least 'format' ({', '.join(FRAME_FORMATS)}), got {spec!r}")
        unknown = sorted(set(spec) - set(FRAME_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; valid: {', '.join(FRAME_KEYS)}")
        resize = spec.get("resize", "linear")
        out[str(name)] = FrameSpec(
            format=_choice(f"{where} format", spec["format"], FRAME_FORMATS, upper=True),
            model_color=_choice(f"{where} model_color", spec.get("model_color", "RGB"), FRAME_COLORS, upper=True),
            model_size=_size(f"{where} model_size", spec.get("model_size")),
            resize=None if resize is None else _choice(f"{where} resize", resize, FRAME_RESIZES, upper=False),
            mean=_floats(f"{where} mean", spec.get("mean")),
            std=_floats(f"{where} std", spec.get("std"), nonzero=True),
            frame_size=_size(f"{where} frame_size", spec.get("frame_size")))
    return out


def _size(key: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value):
        raise ValueError(f"{key}: [height, width] of positive integers, got {value!r}")
    return int(value[0]), int(value[1])


def _floats(key: str, value: Any, nonzero: bool = False) -> tuple[float, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    try:
        floats = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: a number or a list of numbers, got {value!r}") from None
    if not floats or nonzero and any(v == 0 for v in floats):
        raise ValueError(f"{key}: {'non-zero ' if nonzero else ''}numbers, got {value!r}")
    return floats


def _parse_execution_providers(value: Any) -> tuple[tuple[str, dict[str, str]], ...]:
    """``execution_provider``: an EP name, or a list (in order of preference) of names, (name, options) pairs or
    {"name": ..., "options": {...}} dicts."""
    items = [value] if isinstance(value, (str, Mapping)) else value
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or not items:
        raise ValueError(f"option 'execution_provider': an EP name or a list of them (with provider options), got "
                         f"{value!r}")
    out = []
    for item in items:
        name: Any
        opts: Any
        if isinstance(item, str):
            name, opts = item, {}
        elif isinstance(item, Mapping) and set(item) <= {"name", "options"} and isinstance(item.get("name"), str):
            name, opts = item["name"], item.get("options") or {}
        elif isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str):
            name, opts = item[0], item[1]
        else:
            raise ValueError(f"option 'execution_provider': {item!r} is not an EP name, a (name, options) pair or "
                             "{'name': ..., 'options': {...}}")
        if not name or not isinstance(opts, Mapping):
            raise ValueError(f"option 'execution_provider': {item!r} needs an EP name and a dict of options")
        out.append((name, {str(k): str(v) for k, v in opts.items()}))
    return tuple(out)


def _parse_shape_sets(value: Any) -> tuple[dict[str, tuple[int, ...]], ...]:
    """``shapes``: {input: shape}, or a list of such signatures (compiled ahead, the first is the default)."""
    if not isinstance(value, dict) and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if not value:
            raise ValueError("option 'shapes': an empty list; give {input name: shape} or a list of them")
        return tuple(_parse_shapes(v) for v in value)
    return (_parse_shapes(value),)


def _parse_shapes(value: Any) -> dict[str, tuple[int, ...]]:
    if not isinstance(value, (dict, Mapping)):
        raise ValueError(f"option 'shapes' must map input names to shapes, got {value!r}")
    shapes = {}
    for name, shape in value.items():
        try:
            dims = tuple(shape)
        except TypeError:
            raise ValueError(f"option 'shapes': shape of {name!r} is not a sequence: {shape!r}") from None
        # a 0 is a real (zero-size) dim; a scalar input has the empty shape
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ValueError(f"option 'shapes': shape of {name!r} must be integers >= 0, got {shape!r}")
        shapes[str(name)] = dims
    return shapes


def _parse_hw_format(value: Any) -> dict[str, HwFormat]:
    if not isinstance(value, Mapping):
        raise ValueError(f"option 'hw_format' must map tensor names to formats, got {value!r}")
    out = {}
    for name, fmt in value.items():
        if not isinstance(fmt, Mapping) or not set(fmt) <= {"memory_layout", "data_type"}:
            raise ValueError(
                f"option 'hw_format': format of {name!r} must be a dict with 'memory_layout' and/or 'data_type', "
                f"got {fmt!r}"
            )
        layout = fmt.get("memory_layout")
        dtype = fmt.get("data_type")
        out[str(name)] = HwFormat(
            memory_layout=None if layout is None else enum_member(MemoryLayout, layout, f"hw_format[{name!r}] layout"),
            data_type=None if dtype is None else enum_member(DataType, dtype, f"hw_format[{name!r}] data_type"),
        )
    return out
