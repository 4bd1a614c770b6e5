"""The user's ``engine_options`` that configure an ONNX Runtime session (what is left once the EP has taken its
provider options), read once when the model opens.

They come as Python values or as text (the commands' ``--engine-option KEY=VALUE``), so each is read strictly:
``bool("0")`` would turn on an arena that the text turns off. SessionOptions fields get their types, config
entries (``area.key``) stay text, and a name that is neither is refused: an OpenVINO property given to every
backend tried would otherwise become a config entry that ONNX Runtime ignores.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import onnxruntime as ort

from ...options import RunnerOptions
from ...types import NpuError

SPINNING = "session.intra_op.allow_spinning"  # ONNX Runtime's config entry: "1" spins, anything else does not
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_COUNTS = ("intra_op_num_threads", "inter_op_num_threads")
_SWITCHES = ("enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse")
SESSION_FIELDS = (*_COUNTS, *_SWITCHES, "execution_mode")  # set on SessionOptions as read here
OPTIMIZATION = "graph_optimization_level"  # kept as given: the adapter reads it (its own names, and the cache key's)


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
