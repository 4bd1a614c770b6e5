"""The user's ``engine_options`` that configure an ONNX Runtime session (what is left once the EP has taken its
provider options), read once when the model opens.

They come as Python values or as text (the commands' ``--engine-option KEY=VALUE``), so each is read strictly:
``bool("0")`` would turn on an arena that the text turns off. SessionOptions fields get their types, config
entries (``area.key``) stay text, and a name that is neither is refused: an OpenVINO property given to every
backend tried would otherwise become a config entry that ONNX Runtime ignores. ``session_options`` makes the
SessionOptions of every session of a runner from them and npurt's own choices (threads, spinning), and
``engine_settings`` reports what is in effect.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import onnxruntime as ort

from ...options import RunnerOptions, cores
from ...types import NpuError

SPINNING = "session.intra_op.allow_spinning"  # ONNX Runtime's config entry: "1" spins, anything else does not
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_COUNTS = ("intra_op_num_threads", "inter_op_num_threads")
_SWITCHES = ("enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse")
SESSION_FIELDS = (*_COUNTS, *_SWITCHES, "execution_mode")  # set on SessionOptions as read here
OPTIMIZATION = "graph_optimization_level"  # kept as given: read by optimization_name (its own names, the cache key's)

OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# each level as the cache key names it: the text str(level) gives, written out (pybind11's str of an enum member took
# ~30 us the first time in a process, in every warm load; tests/test_cache.py checks that the texts agree)
OPTIMIZATION_KEY_TEXTS = {
    "disable": "GraphOptimizationLevel.ORT_DISABLE_ALL",
    "basic": "GraphOptimizationLevel.ORT_ENABLE_BASIC",
    "extended": "GraphOptimizationLevel.ORT_ENABLE_EXTENDED",
    "all": "GraphOptimizationLevel.ORT_ENABLE_ALL",
}


def decoder_threads(cpus: int) -> int:
    """A decoder session's intra-op threads where nothing sets them: onnxruntime-genai's default for its decoder
    session, half the CPUs, 1 to 16 (onnxruntime-genai src/models/model.cpp, Model::CreateSessionOptionsFromConfig:
    ``std::min(std::max(1, hardware_concurrency() / 2), 16)``; 1 thread on a 2-core machine)."""
    return max(1, min(cpus // 2, 16))


def intra_op_threads(options: RunnerOptions, cpus: int) -> int | None:
    """Intra-op threads per run: option num_threads; with THROUGHPUT, the ``cpus`` shared by the concurrent runs; a
    decoder (option decoder), onnxruntime-genai's count (``decoder_threads``); else None, ONNX Runtime's default
    (every physical core for one run)."""
    if options.num_threads is not None:
        return options.num_threads
    if options.performance_hint == "THROUGHPUT":
        return max(1, cpus // (options.max_concurrent_runs or 2))
    if options.decoder is not None:
        # ONNX Runtime's own (both cores of the 2-core VM, spinning) decoded at 0.5-0.65x onnxruntime-genai's
        # tokens/s whenever anything else ran there
        return decoder_threads(cpus)
    return None


def spinning_off(options: RunnerOptions) -> bool:
    """Whether idle intra-op threads stop spin-waiting: with several runs at once they steal each other's cores. One
    run at a time keeps ONNX Runtime's default (spinning): its threads wait for that run's next parallel section."""
    return options.performance_hint == "THROUGHPUT" and (options.max_concurrent_runs or 2) > 1


def optimization_name(given: Mapping[str, Any]) -> str:
    """engine_options' graph_optimization_level as a name of OPTIMIZATION_LEVELS (ValueError for a bad one), else
    ONNX Runtime's default: all."""
    value = given.get(OPTIMIZATION, "all")
    name = str(value).strip().lower()
    if name not in OPTIMIZATION_LEVELS:
        raise ValueError(f"engine_options 'graph_optimization_level': {value!r} is not one of "
                         f"{', '.join(OPTIMIZATION_LEVELS)}")
    return name


def session_options(options: RunnerOptions, given: Mapping[str, Any], log_severity: int,
                    no_cpu_fallback: bool = False) -> ort.SessionOptions:
    """The SessionOptions every session of a runner is made with: npurt's choices (threads, spinning), then the
    engine options as read (``given``: ``read_session_options``'), ``no_cpu_fallback`` forbidding nodes on the CPU."""
    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    threads = intra_op_threads(options, cores())
    if threads is not None:
        so.intra_op_num_threads = threads
    if spinning_off(options) and SPINNING not in given:  # (an entry added twice: a warning)
        so.add_session_config_entry(SPINNING, "0")
    level = OPTIMIZATION_LEVELS[optimization_name(given)]
    for key, value in given.items():
        if key == OPTIMIZATION:
            continue  # (the level above)
        if key in SESSION_FIELDS:
            setattr(so, key, value)
        else:
            so.add_session_config_entry(key, str(value))
    so.graph_optimization_level = level
    if no_cpu_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


def engine_settings(options: RunnerOptions, given: Mapping[str, Any]) -> dict[str, str]:
    """What the sessions run with: the threads and spinning in effect (engine_options win, as on the session), the
    hint, and every other session option as read (``read_session_options``)."""
    threads = given["intra_op_num_threads"] if "intra_op_num_threads" in given else intra_op_threads(options, cores())
    spinning = given.get(SPINNING, "0" if spinning_off(options) else "1")
    settings = {"intra_op_num_threads": str(threads) if threads else "0 (every physical core)",
                "allow_spinning": str(spinning)}
    if options.performance_hint:
        settings["performance_hint"] = options.performance_hint
    settings.update((k, v.name if isinstance(v, ort.ExecutionMode) else str(v)) for k, v in given.items()
                    if k not in ("intra_op_num_threads", SPINNING))
    return settings


def read_session_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """The session's engine options as read: SESSION_FIELDS as their types, config entries as text (SPINNING as
    "1" / "0", the only spellings ONNX Runtime tells apart), the optimization level as given. ValueError for a bad
    value; NpuError for a name that is none of these."""
    read: dict[str, Any] = {}
    for key, value in given.items():
        if key in _COUNTS:
            read[key] = _count(key, value)
        elif key in _SWITCHES:
            read[key] = _flag(key, value)
        elif key == "execution_mode":
            read[key] = _execution_mode(value)
        elif key == OPTIMIZATION:
            read[key] = value
        elif key == SPINNING:
            read[key] = "1" if _flag(key, value) else "0"
        elif "." in key:
            read[key] = str(value)
        else:
            fields = ", ".join((*SESSION_FIELDS, OPTIMIZATION))
            raise NpuError(f"ONNX Runtime has no session option {key!r} (its fields: {fields}; its config entries "
                           f"are named like {SPINNING})")
    return read


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    flag = _FLAGS.get(str(value).strip().lower())
    if flag is None:
        raise ValueError(f"engine_options {key!r}: {value!r} is not on or off (true / false, 1 / 0, yes / no, "
                         "on / off)")
    return flag


def _count(key: str, value: Any) -> int:
    count = -1
    if isinstance(value, str):
        text = value.strip()
        count = int(text) if text.isascii() and text.isdigit() else -1
    elif not isinstance(value, bool):
        try:
            count = operator.index(value)  # ints, numpy's included
        except TypeError:
            pass
    if count < 0:
        raise ValueError(f"engine_options {key!r}: {value!r} is not a thread count (0: ONNX Runtime's default)")
    return count


def _execution_mode(value: Any) -> ort.ExecutionMode:
    if isinstance(value, ort.ExecutionMode):
        return value
    mode = str(value).strip().lower().removeprefix("ort_")
    if mode not in ("parallel", "sequential"):
        raise ValueError(f"engine_options 'execution_mode': {value!r} is not parallel or sequential")
    return ort.ExecutionMode.ORT_PARALLEL if mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
