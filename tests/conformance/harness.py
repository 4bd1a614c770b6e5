"""Differential conformance: ONNX's backend node cases through npurt and through the engines used directly.

For every case and backend a worker process produces a ``Record``:

- the raw engine's verdict against ONNX's expected outputs (rtol 1e-3, atol 1e-5, NaN equal NaN, shapes and
  dtypes must match): ONNX Runtime ``InferenceSession(path, providers=["CPUExecutionProvider"])`` with default
  session options, or OpenVINO ``compile_model(read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})``;
- npurt's ``runner.run(feeds)`` on CPU views, judged the same way (and, for VAIML, compared bit for bit with
  ONNX Runtime's own outputs);
- opt-in (``--backend qnn``), the QNN column: ONNX Runtime + QNN EP on Qualcomm's HTP (the emulator on x86-64)
  used directly, as its documentation shows, and npurt's QNN runner on the NPU at CPU views (npurt's FP16 HW views
  would differ from the raw EP's float inputs), with the same provider options on both (npurt's defaults for the
  HTP, FP16 precision), each judged against ONNX's expected outputs at the FP16 tolerance (``TOLERANCE``) and
  npurt's outputs compared bit for bit with the raw EP's. A model with open input dims is pinned to the case's
  feeds on the raw side (the HTP compiles static shapes; npurt pins them itself). 0.3-1 s a case and side on the
  emulator: the whole column is a script run (15-50 minutes on 2 cores); the suite runs a slice (``--limit``);
- where every output's CPU info is static, ``runner.execute`` into output buffers pre-filled with a sentinel
  byte pattern, so that an output nothing wrote (SUCCESS over unwritten memory) is caught.

``differences(records)`` applies the rule per backend (see ``_difference``). Workers are spawned processes
that import the engines once and take cases one at a time from the parent, which tracks the stage each
worker is in: a crash (segfault, abort) or a hang (per-case timeout) is pinned to one case, backend and
stage, and the worker is replaced. CLI::

    python -m tests.conformance.harness --backend {vaiml,openvino,both,qnn} [--jobs N] [-k SUBSTRING]
                                        [--offset N] [--limit N] [--write-verdicts] [--report]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np

from . import cases as case_store

BACKENDS = ("vaiml", "openvino")  # the suite's columns ("both"); "qnn" is opt-in
OPT_IN_BACKENDS = ("qnn",)
RUNNER_TYPE = {"vaiml": "VAIML", "openvino": "OPENVINO", "qnn": "QNN"}
ENGINE_NAME = {"vaiml": "onnxruntime", "openvino": "openvino", "qnn": "onnxruntime-qnn"}
RTOL, ATOL = 1e-3, 1e-5
# FP16 on the HTP: each rounding is off by up to 2^-11 (4.9e-4) of the value, and a node rounds its inputs, its
# intermediates and its output; values near 0 keep FP16's absolute resolution near the inputs' scale.
FP16_RTOL, FP16_ATOL = 1e-2, 1e-3
TOLERANCE = {"vaiml": (RTOL, ATOL), "openvino": (RTOL, ATOL), "qnn": (FP16_RTOL, FP16_ATOL)}
# The EP's options on both sides of the QNN column: npurt's defaults for the HTP (docs/devices.md).
QNN_PROVIDER_OPTIONS = {"backend_type": "htp", "enable_htp_fp16_precision": "1", "soc_model": "60"}
SENTINEL = 0xA5  # byte pattern of output buffers before execute: still there afterwards = nothing wrote it
CASE_TIMEOUT_S = 60.0
VERDICTS_DIR = Path(__file__).parent / "verdicts"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
DOCS_BEGIN, DOCS_END = "<!-- conformance-counts:begin -->", "<!-- conformance-counts:end -->"


# ------------------------------------------------------------------------------------------- records
@dataclass
class Outcome:
    """What one side did with one case.

    status: "pass" / "fail" (wrong values) / "error" (the raw engine raised) for the engines; for npurt
    "pass" / "fail" / "refused" (NpuError) / "escaped" (a raw engine exception came through) / "exception"
    (any other exception type) / "unwritten" / "status" (execute returned a non-SUCCESS code); "crash" /
    "hang" for either side; "skipped" where it was not run.
    """

    status: str
    reason: str = ""
    stage: str = ""  # where it happened: "load", "run", "execute", "judge"
    exc_type: str = ""  # the exception's class, module-qualified


@dataclass
class Record:
    case: str
    backend: str
    out_of_scope: list[str] = field(default_factory=list)  # ports numpy/run() cannot carry (see cases.Port)
    engine: Outcome = field(default_factory=lambda: Outcome("skipped"))
    engine_source: str = "inline"  # "inline" or "verdicts" (the version-matched verdict file)
    npurt: Outcome = field(default_factory=lambda: Outcome("skipped"))  # run(feeds)
    execute: Outcome = field(default_factory=lambda: Outcome("skipped"))  # execute() into sentinel buffers
    same_as_engine: bool | None = None  # VAIML: npurt's outputs bit-equal to ONNX Runtime's (None: nothing to compare)
    note: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        d = dict(d)
        for k in ("engine", "npurt", "execute"):
            d[k] = Outcome(**d[k])
        return cls(**d)


@dataclass
class Difference:
    case: str
    backend: str
    category: str
    reason: str

    def __str__(self) -> str:
        return f"{self.backend} {self.case}: [{self.category}] {_one_line(self.reason, 300)}"


# ------------------------------------------------------------------------------------------- judging
def _is_ml_dtype(dtype: np.dtype) -> bool:
    return type(dtype).__module__.startswith("ml_dtypes") or dtype.type.__module__.startswith("ml_dtypes")


def _numeric(a: np.ndarray) -> np.ndarray:
    """ml_dtypes arrays (bfloat16, float8, int4) as plain numpy numbers, to compare values."""
    if _is_ml_dtype(a.dtype):
        return a.astype(np.float32) if "float" in a.dtype.name else a.astype(np.int16)
    return a


def judge(expected: Any, actual: Any, what: str = "output", rtol: float = RTOL, atol: float = ATOL) -> str:
    """"" if ``actual`` matches ONNX's ``expected`` (rtol 1e-3, atol 1e-5 unless given, NaN == NaN), else why
    not."""
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{what}: expected a sequence of {len(expected)}, got {_describe(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            why = judge(e, a, f"{what}[{i}]", rtol, atol)
            if why:
                return why
        return ""
    if expected is None:
        return "" if actual is None else f"{what}: expected an empty optional, got {_describe(actual)}"
    if isinstance(expected, dict):
        return "" if expected == actual else f"{what}: maps differ"
    expected = np.asarray(expected)
    if not isinstance(actual, np.ndarray):
        return f"{what}: expected {_describe(expected)}, got {_describe(actual)}"
    if actual.dtype != expected.dtype:
        return f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"{what}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    e, a = _numeric(expected), _numeric(actual)
    if e.dtype.kind in "fc":
        close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            bad = int((~close).sum())
            k = int(np.argmin(close.reshape(-1)))
            return (f"{what}: {bad} of {close.size} values off (first at flat index {k}: "
                    f"{a.reshape(-1)[k]!r}, expected {e.reshape(-1)[k]!r})")
        return ""
    if not np.array_equal(a, e):
        neq = a != e
        k = int(np.argmax(neq.reshape(-1)))
        return (f"{what}: {int(neq.sum())} of {neq.size} values differ (first at flat index {k}: "
                f"{a.reshape(-1)[k]!r}, expected {e.reshape(-1)[k]!r})")
    return ""


def identical(a: Any, b: Any) -> bool:
    """Bit-for-bit the same results (NaN equal NaN; same dtype and shape), for npurt against ONNX Runtime."""
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(identical(x, y) for x, y in zip(a, b)))
    if a is None or b is None:
        return a is None and b is None
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if _is_ml_dtype(a.dtype):
        a, b = _numeric(a), _numeric(b)
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{list(v.shape)}"
    if isinstance(v, list):
        return f"a sequence of {len(v)}"
    return type(v).__name__


def _judge_all(expected: list[Any], actual: list[Any], names: list[str], backend: str = "vaiml") -> str:
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    rtol, atol = TOLERANCE[backend]
    for name, e, a in zip(names, expected, actual):
        why = judge(e, a, f"output {name!r}", rtol, atol)
        if why:
            return why
    return ""


def _one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exc_type(e: BaseException) -> str:
    t = type(e)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# ------------------------------------------------------------------------------------------- engines
class Engines:
    """The raw engines as a user would call them; imported once per worker."""

    def __init__(self) -> None:
        import onnxruntime
        import openvino

        self.ort = onnxruntime
        self.ov = openvino
        self._core: Any = None

    @property
    def core(self) -> Any:
        if self._core is None:
            self._core = self.ov.Core()
        return self._core

    def run(self, backend: str, case: case_store.Case) -> tuple[Outcome, list[Any] | None]:
        """(verdict, outputs per graph output or None) of the raw engine."""
        names = [p.name for p in case.outputs]
        run = {"vaiml": self._run_ort, "openvino": self._run_openvino, "qnn": self._run_qnn}[backend]
        try:
            outputs = run(case)
        except Exception as e:  # noqa: BLE001 - the engine's refusal, whatever its type
            return Outcome("error", _one_line(f"{type(e).__name__}: {e}"), "run", _exc_type(e)), None
        outputs = [_as_expected_dtype(o, e) for o, e in zip(outputs, case.expected)]
        why = _judge_all(case.expected, outputs, names, backend)
        return (Outcome("fail", why, "judge") if why else Outcome("pass")), outputs

    def _run_ort(self, case: case_store.Case) -> list[Any]:
        session = self.ort.InferenceSession(str(case.model_path), providers=["CPUExecutionProvider"])
        feeds = {i.name: case.feeds[i.name] for i in session.get_inputs() if i.name in case.feeds}
        return list(session.run(None, feeds))

    def _run_qnn(self, case: case_store.Case) -> list[Any]:
        """ONNX Runtime + QNN EP (tests.helpers.qnn.raw_qnn_session: the EP's documented use), the model's open
        input dims pinned to the case's feeds, without the Python API's retry on the CPU provider."""
        import onnx

        from npurt.onnx_edit import with_input_shapes
        from npurt.onnx_graph import graph_inputs
        from tests.helpers.qnn import raw_qnn_session

        model = onnx.load(str(case.model_path))
        shapes = {v.name: list(np.shape(case.feeds[v.name])) for v in graph_inputs(model.graph)
                  if v.name in case.feeds and isinstance(case.feeds[v.name], np.ndarray)
                  and not all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)}
        if not shapes:
            session = raw_qnn_session(case.model_path, QNN_PROVIDER_OPTIONS)
        else:
            with tempfile.TemporaryDirectory(prefix="npurt-qnn-case-") as folder:
                pinned = Path(folder) / "model.onnx"
                onnx.save(with_input_shapes(model, shapes), str(pinned))
                session = raw_qnn_session(pinned, QNN_PROVIDER_OPTIONS)
        # ONNX Runtime's Python API retries a run the EP fails on the CPU provider (saying so on stdout only): off,
        # so that the raw verdict is the EP's (npurt raises NpuError there)
        session.disable_fallback()
        feeds = {i.name: case.feeds[i.name] for i in session.get_inputs() if i.name in case.feeds}
        return list(session.run(None, feeds))

    def _run_openvino(self, case: case_store.Case) -> list[Any]:
        model = self.core.read_model(str(case.model_path))
        compiled = self.core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        # OpenVINO's ONNX frontend may drop an unused input or expose one under another name: feed each
        # compiled input the case input that carries one of its names, else the one at its position.
        feeds: dict[int, Any] = {}
        ordered = [p.name for p in case.inputs]
        for k, port in enumerate(compiled.inputs):
            names = port.get_names()
            name = next((n for n in ordered if n in names), ordered[k] if k < len(ordered) else None)
            if name is None or name not in case.feeds:
                raise RuntimeError(f"no case input for OpenVINO input {k} {sorted(names)}")
            feeds[k] = case.feeds[name]
        request = compiled.create_infer_request()
        results = request.infer(feeds)
        by_port = list(compiled.outputs)
        outputs = []
        for j, port in enumerate(case.outputs):
            match = next((o for o in by_port if port.name in o.get_names()), None)
            if match is None and len(by_port) == len(case.outputs):
                match = by_port[j]
            if match is None:
                raise RuntimeError(f"OpenVINO compiled no output for {port.name!r}")
            outputs.append(np.array(results[match], copy=True))
        return outputs


# ------------------------------------------------------------------------------------------- npurt
_REFUSAL_CATEGORIES = [
    (re.compile(r"dynamic dim|input shapes .* differ", re.I), "refused: dynamic input"),
    (re.compile(r"dynamic|data-dependent|value-dependent|static output|computed output shape", re.I),
     "refused: dynamic output"),
    (re.compile(r"FLOAT64|DOUBLE|\bf64\b|float64", re.I), "refused: float64"),
    (re.compile(r"unknown inputs|missing inputs|no port|not an? (input|output)", re.I),
     "ports differ from the model's"),
    (re.compile(r"element type|DataType|data type|dtype", re.I), "refused: element type"),
]


def _refusal_category(reason: str) -> str:
    for pattern, category in _REFUSAL_CATEGORIES:
        if pattern.search(reason):
            return category
    return "refused: other"


def _is_engine_exception(e: BaseException) -> bool:
    """An exception of ONNX Runtime's or OpenVINO's, or raised from their frames, rather than npurt's."""
    if type(e).__module__.split(".")[0] in ("onnxruntime", "openvino"):
        return True
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and any(f"{os.sep}{pkg}{os.sep}" in last for pkg in ("onnxruntime", "openvino"))


def _exception_outcome(e: BaseException, stage: str) -> Outcome:
    import npurt

    reason = _one_line(f"{type(e).__name__}: {e}")
    if isinstance(e, npurt.NpuError):
        return Outcome("refused", reason, stage, _exc_type(e))
    return Outcome("escaped" if _is_engine_exception(e) else "exception", reason, stage, _exc_type(e))


def _as_port_dtype(value: Any, dtype: np.dtype) -> Any:
    """A feed in the dtype npurt's port declares, where only the numpy spelling differs (bfloat16 bits as
    uint16, as npurt shows BF16); anything else is passed as it is, for npurt to accept or refuse."""
    if (isinstance(value, np.ndarray) and value.dtype != dtype and _is_ml_dtype(value.dtype)
            and value.dtype.itemsize == dtype.itemsize):
        return value.view(dtype)
    return value


def _as_expected_dtype(value: Any, expected: Any) -> Any:
    """An output whose numpy spelling is raw bits of ONNX's type (float8 as uint8, bfloat16 as uint16) viewed
    as that type, so that its values can be judged; anything else as it is."""
    if (isinstance(value, np.ndarray) and isinstance(expected, np.ndarray) and value.dtype != expected.dtype
            and _is_ml_dtype(expected.dtype) and value.dtype.kind in "ui"
            and value.dtype.itemsize == expected.dtype.itemsize):
        return value.view(expected.dtype)
    return value


def _static(shape: Sequence[Any]) -> bool:
    return all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape)


def run_npurt(backend: str, case: case_store.Case, stage: Callable[[str], None],
              partial: Callable[[str, Any], None] = lambda kind, payload: None
              ) -> tuple[Outcome, Outcome, list[Any] | None, list[Any] | None]:
    """(run verdict, execute verdict, run outputs, execute outputs) of npurt on one case."""
    import npurt

    names = [p.name for p in case.outputs]
    options: dict[str, Any] = {"device": "CPU", "input_tensor_type": "CPU", "output_tensor_type": "CPU"}
    if backend == "qnn":  # the HTP at CPU views, the raw side's provider options
        options.update(device="NPU", log_level="ERROR", engine_options=dict(QNN_PROVIDER_OPTIONS))
    stage("npurt:load")
    try:
        runner = npurt.RunnerFactory.create_runner(RUNNER_TYPE[backend], str(case.model_path), options)
    except Exception as e:  # noqa: BLE001
        return _exception_outcome(e, "load"), Outcome("skipped", "not loaded"), None, None
    try:
        stage("npurt:run")
        feeds = {p.name: case.feeds[p.name] for p in case.inputs if p.name in case.feeds}
        outputs: list[Any] | None = None
        try:
            in_infos = {i.name: i for i in runner.get_tensors_info(npurt.TensorDirection.INPUT,
                                                                   npurt.TensorType.CPU)}
            feeds = {n: _as_port_dtype(v, in_infos[n].numpy_dtype) if n in in_infos else v for n, v in feeds.items()}
            results = runner.run(feeds)
            outputs = [_as_expected_dtype(results[n], e) if n in results else None
                       for n, e in zip(names, case.expected)]
            missing = [n for n in names if n not in results]
            if missing:
                run = Outcome("fail", f"outputs {missing} missing from run()'s results {sorted(results)}", "run")
            else:
                why = _judge_all(case.expected, outputs, names, backend)
                run = Outcome("fail", why, "judge") if why else Outcome("pass")
        except Exception as e:  # noqa: BLE001
            run = _exception_outcome(e, "run")
        partial("run", run)
        stage("npurt:execute")
        try:
            execute, exec_outputs = _execute(runner, case, feeds, backend)
        except Exception as e:  # noqa: BLE001 - execute must never raise
            execute, exec_outputs = _exception_outcome(e, "execute"), None
        return run, execute, outputs, exec_outputs
    finally:
        try:
            runner.close()
        except Exception:  # noqa: BLE001
            pass


def _execute(runner: Any, case: case_store.Case, feeds: dict[str, Any], backend: str
             ) -> tuple[Outcome, list[Any] | None]:
    """execute() with CPU NpuTensors, outputs pre-filled with the sentinel, judged buffer by buffer."""
    import npurt

    in_infos = runner.get_tensors_info(npurt.TensorDirection.INPUT, npurt.TensorType.CPU)
    out_infos = runner.get_tensors_info(npurt.TensorDirection.OUTPUT, npurt.TensorType.CPU)
    if not all(_static(i.shape) for i in out_infos):
        return Outcome("skipped", "an output's CPU info is not static"), None
    inputs = []
    for info in in_infos:
        value = feeds.get(info.name)
        if not isinstance(value, np.ndarray):
            return Outcome("skipped", f"input {info.name!r} has no array feed"), None
        array = np.ascontiguousarray(value)
        if array.dtype != info.numpy_dtype:
            return Outcome("skipped", f"input {info.name!r}: feed {array.dtype}, port {info.numpy_dtype}"), None
        if tuple(array.shape) != tuple(info.shape):
            # the outputs' infos are for the runner's default input shapes, not this feed's
            return Outcome("skipped", f"input {info.name!r}: feed shape {list(array.shape)} is not the "
                                      f"runner's default {list(info.shape)}"), None
        inputs.append(npurt.NpuTensor(info.replace(shape=array.shape), array))
    buffers = [np.full(max(info.size_in_bytes, 0), SENTINEL, np.uint8) for info in out_infos]
    out_tensors = [npurt.NpuTensor(info, buf) for info, buf in zip(out_infos, buffers)]
    status = runner.execute([inputs], [out_tensors])
    if status is not npurt.StatusCode.SUCCESS:
        return Outcome("status", _one_line(f"{status.name}: {runner.last_error}"), "execute"), None
    by_name = {}
    for info, buf in zip(out_infos, buffers):
        by_name[info.name] = buf[: info.size * info.numpy_dtype.itemsize].view(info.numpy_dtype).reshape(info.shape)
    names = [p.name for p in case.outputs]
    missing = [n for n in names if n not in by_name]
    if missing:
        return Outcome("fail", f"outputs {missing} are not among the runner's outputs {sorted(by_name)}",
                       "execute"), None
    outputs = [_as_expected_dtype(by_name[n].copy(), e) for n, e in zip(names, case.expected)]
    buffer_of = {info.name: buf for info, buf in zip(out_infos, buffers)}
    for name, e in zip(names, case.expected):
        buf = buffer_of[name]
        if buf.size and bool((buf == SENTINEL).all()):
            # unless ONNX's expected bytes are that very pattern
            same = (isinstance(e, np.ndarray) and e.dtype.kind != "O" and e.nbytes == buf.size
                    and bool((np.ascontiguousarray(e).view(np.uint8) == SENTINEL).all()))
            if not same:
                return Outcome("unwritten", f"output {name!r}: execute returned SUCCESS but every byte of its "
                                            f"buffer still holds the sentinel 0x{SENTINEL:02X}", "execute"), outputs
    why = _judge_all(case.expected, outputs, names, backend)
    return (Outcome("fail", why, "judge") if why else Outcome("pass")), outputs


# ------------------------------------------------------------------------------------------- the rule
def _named_refusal_at_load(rec: Record) -> bool:
    """An out-of-scope case refused at load with NpuUnsupportedError whose message names the port."""
    n = rec.npurt
    if not (rec.out_of_scope and n.status == "refused" and n.stage == "load"
            and n.exc_type.endswith("NpuUnsupportedError")):
        return False
    ports = [re.search(r"'([^']*)'", r) for r in rec.out_of_scope]
    return any(m is not None and m.group(1) in n.reason for m in ports)


def _difference(rec: Record) -> tuple[str, str] | None:
    """(category, reason) where the record breaks its backend's rule, else None.

    Both backends: npurt never crashes, hangs or lets an exception other than NpuError escape; an
    out-of-scope case (sequence / map / optional / string / numpy-less dtype port) may be refused at load
    with NpuUnsupportedError naming the port, else the rule below applies to it too.
    VAIML: ONNX Runtime passes -> npurt succeeds with outputs bit-equal to ONNX Runtime's (run and
    execute); ONNX Runtime fails -> npurt raises NpuError or returns exactly ONNX Runtime's outputs.
    QNN: the same rule against ONNX Runtime + QNN EP (at the FP16 tolerance): where the raw EP passes npurt
    passes, and every result npurt returns is the raw EP's, bit for bit.
    OPENVINO: OpenVINO passes -> npurt passes (run and execute); OpenVINO fails -> anything but the
    universal failures above.
    """
    n, x, eng = rec.npurt, rec.execute, rec.engine
    for o, what in ((n, "run"), (x, "execute")):
        if o.status in ("crash", "hang"):
            return o.status, f"npurt {what} ({o.stage}): {o.reason}"
        if o.status == "escaped":
            return "raw exception escaped", f"{what}: {o.exc_type}: {o.reason}"
        if o.status == "exception":
            kind = _refusal_category(o.reason).removeprefix("refused: ")
            return f"{'unexpected exception' if kind == 'other' else kind} ({o.exc_type})", f"{what}: {o.reason}"
    if _named_refusal_at_load(rec):
        return None
    if rec.out_of_scope and n.status == "pass" and x.status in ("pass", "skipped"):
        return None  # npurt carried a port the case is out of scope for, and got ONNX's expected outputs
    engine_passes = eng.status == "pass"
    if n.status == "refused":
        if not engine_passes:
            return None
        if rec.out_of_scope:
            return ("out of scope, not refused at load as NpuUnsupportedError naming the port",
                    f"{n.stage}: {n.exc_type}: {n.reason}")
        return _refusal_category(n.reason), f"{n.stage}: {n.reason}"
    if x.status == "unwritten":
        return "unwritten output", x.reason
    bit_exact = rec.backend in ("vaiml", "qnn")  # npurt's outputs are the raw engine's own
    if "missing" in n.reason and (engine_passes or bit_exact):
        return "ports differ from the model's", n.reason
    if bit_exact:
        engine = "ONNX Runtime" + (" + QNN EP" if rec.backend == "qnn" else "")
        if eng.status in ("error", "crash", "hang"):
            return ("result where the engine errors",
                    f"{engine}: {eng.status} ({eng.reason}); npurt returned outputs")
        if rec.same_as_engine is False:
            if not engine_passes:
                category = "differs from the engine's wrong result"
            elif n.status == "fail" or x.status == "fail":
                category = "wrong values"
            else:
                category = f"not bit-exact with {engine}"
            return category, f"npurt's outputs are not {engine}'s: {n.reason or x.reason or 'within tolerance'}"
        if x.status == "status" and engine_passes:
            return "execute failed", x.reason
        if engine_passes and (n.status == "fail" or x.status == "fail"):  # (unreachable when bit-exact)
            return "wrong values", n.reason or x.reason
        return None
    # openvino
    if not engine_passes:
        return None
    if n.status == "fail":
        return "wrong values", n.reason
    if x.status == "fail":
        return "wrong values (execute)", x.reason
    if x.status == "status":
        return "execute failed", x.reason
    return None


def differences(records: Iterable[Record]) -> list[Difference]:
    out = []
    for rec in records:
        d = _difference(rec)
        if d is not None:
            category = d[0]
            if rec.out_of_scope and not category.startswith("out of scope"):
                category = f"out of scope, not refused at load: {category}"
            out.append(Difference(rec.case, rec.backend, category, d[1]))
    return out


# ------------------------------------------------------------------------------------------- verdict files
def engine_version(backend: str) -> str:
    if backend == "vaiml":
        import onnxruntime

        return onnxruntime.__version__
    if backend == "qnn":
        import onnxruntime

        from npurt.backends.onnxruntime.qnn import qnn_versions

        versions = qnn_versions()
        return f"{onnxruntime.__version__}, QNN SDK {versions['qnn_sdk']}, onnxruntime-qnn {versions['package']}"
    import openvino

    return openvino.get_version()


def verdict_path(backend: str, version: str | None = None) -> Path:
    version = engine_version(backend) if version is None else version
    return VERDICTS_DIR / f"{ENGINE_NAME[backend]}-{version.split('-')[0]}.json"


def load_verdicts(backend: str) -> dict[str, Outcome] | None:
    """The raw engine's verdicts for the installed engine and onnx versions, or None (compute them inline)."""
    import onnx

    path = verdict_path(backend)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("engine_version") != engine_version(backend) or data.get("onnx") != onnx.__version__:
        return None
    return {name: Outcome(v["verdict"], v.get("reason", "")) for name, v in data["cases"].items()}


# source locations and check expressions that start OpenVINO's and ONNX Runtime's messages
_ENGINE_NOISE = re.compile(r"(Exception from \S+:\d+:\s*|Check '[^']*' failed at \S+:\s*|/onnxruntime_src/\S+ )")


def write_verdicts(records: Sequence[Record], backend: str) -> Path:
    import onnx

    cases = {}
    for rec in sorted(records, key=lambda r: r.case):
        if rec.backend != backend or rec.engine_source != "inline":
            continue
        entry = {"verdict": rec.engine.status}
        if rec.engine.reason:
            entry["reason"] = _one_line(_ENGINE_NOISE.sub("", rec.engine.reason), 160)
        cases[rec.case] = entry
    data = {"engine": ENGINE_NAME[backend], "engine_version": engine_version(backend), "onnx": onnx.__version__,
            "how": ("ONNX Runtime InferenceSession(model, providers=['CPUExecutionProvider']), default options"
                    if backend == "vaiml" else
                    "OpenVINO compile_model(read_model(model), 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})"),
            "tolerance": {"rtol": RTOL, "atol": ATOL}, "cases": cases}
    path = verdict_path(backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({k: v for k, v in data.items() if k != "cases"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in cases.items())
    path.write_text(f"{head},\n \"cases\": {{\n{rows}\n }}\n}}\n")  # one case per line: diffs stay readable
    return path


# ------------------------------------------------------------------------------------------- worker
@dataclass
class Task:
    case: str
    backend: str
    verdict: Outcome | None = None  # the raw engine's verdict from a verdict file (OpenVINO), else run inline
    engine_crashed: Outcome | None = None  # the raw engine crashed / hung on this case in an earlier worker


FAULT_ENV = "NPURT_CONFORMANCE_FAULT"


def _inject_fault(case: str, stage: str) -> None:
    """Fault injection for the harness's own test: ``$NPURT_CONFORMANCE_FAULT`` holds entries
    ``<case>@<stage>=<segv|abort|hang>`` (comma-separated); the worker does that on entering the stage."""
    for entry in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        where, _, kind = entry.partition("=")
        if where == f"{case}@{stage}":
            if kind == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif kind == "abort":
                os.abort()
            elif kind == "hang":
                time.sleep(3600)


def _worker_main(conn: Connection, root: str, log_path: str, cpus: list[int] | None) -> None:
    """Take tasks from the parent until told to stop; report the stage before each risky step."""
    if cpus:
        # Each worker on its own cores: both engines size their thread pools from the process's affinity,
        # so workers do not oversubscribe the machine (20-30% less wall time here, 2 workers on 2 cores).
        os.sched_setaffinity(0, cpus)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)  # engine logs and abort messages land in the worker's log, not the terminal
    os.dup2(log_fd, 1)  # and what an engine's library prints on stdout (the HTP emulator's first-use line)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    import warnings

    warnings.simplefilter("ignore")
    engines = Engines()
    import npurt  # noqa: F401 - loaded once, not inside the first case's timing

    def send(kind: str, payload: Any) -> None:
        conn.send((kind, payload))

    send("ready", os.getpid())
    while True:
        task: Task | None = conn.recv()
        if task is None:
            return
        print(f"=== {task.backend} {task.case}", file=sys.stderr, flush=True)
        send("record", _run_task(task, Path(root), engines, send))


def _run_task(task: Task, root: Path, engines: Engines, send: Callable[[str, Any], None]) -> Record:
    """One case through the raw engine and npurt. ``send`` reports stages and partial results to the parent,
    which needs them to write the record itself if this process dies."""
    t0 = time.perf_counter()

    def stage(name: str) -> None:
        send("stage", name)
        _inject_fault(task.case, name)

    case = case_store.load_case(task.case, root)
    rec = Record(task.case, task.backend, out_of_scope=case.out_of_scope)
    engine_outputs: list[Any] | None = None
    if task.engine_crashed is not None:
        rec.engine = task.engine_crashed
    elif task.verdict is not None and task.backend == "openvino":
        rec.engine, rec.engine_source = task.verdict, "verdicts"
    else:
        stage("engine")
        rec.engine, engine_outputs = engines.run(task.backend, case)
    send("engine", rec.engine)
    rec.npurt, rec.execute, outputs, exec_outputs = run_npurt(task.backend, case, stage, send)
    send("execute", rec.execute)
    if task.backend in ("vaiml", "qnn") and engine_outputs is not None:
        compared = [o for o in (outputs, exec_outputs) if o is not None]
        if compared:
            rec.same_as_engine = all(identical(o, engine_outputs) for o in compared)
    if rec.engine_source == "verdicts" and _difference(rec) is not None:
        # A difference against a verdict-file verdict is confirmed against the engine itself: the file
        # may come from another machine (OpenVINO's CPU plugin picks kernels by ISA).
        stage("engine recheck")
        inline, _ = engines.run(task.backend, case)
        if inline.status != rec.engine.status:
            rec.note = f"verdict file says {rec.engine.status}, the engine here says {inline.status}"
        rec.engine, rec.engine_source = inline, "inline"
    rec.seconds = time.perf_counter() - t0
    return rec


# ------------------------------------------------------------------------------------------- parent
class _Worker:
    def __init__(self, ctx: Any, root: Path, log_dir: Path, serial: int, slot: int, cpus: list[int] | None) -> None:
        self.log_path = log_dir / f"worker{serial}.log"
        self.slot = slot  # which share of the cores it runs on; a replacement takes over its slot
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, str(root), str(self.log_path), cpus),
                                   daemon=True)
        self.process.start()
        child.close()
        self.ready = False  # it imported the engines and waits for tasks
        self.task: Task | None = None
        self.stage = ""
        self.started = 0.0
        self.partial: dict[str, Outcome] = {}  # outcomes the worker reported before its record

    def give(self, task: Task) -> None:
        self.task, self.stage, self.started, self.partial = task, "queued", time.monotonic(), {}
        self.conn.send(task)

    def log_tail(self, case: str, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        marker = f"=== {self.task.backend if self.task else ''} {case}"
        text = text[text.rfind(marker) + len(marker):] if case and marker in text else text
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, EOFError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _record_of_lost(task: Task, stage: str, partial: dict[str, Outcome], failed: Outcome, root: Path) -> Record:
    """The record of a task whose worker crashed or hung after the raw engine's stage, from what it reported."""
    try:
        out_of_scope = case_store.load_case(task.case, root).out_of_scope
    except Exception:  # noqa: BLE001
        out_of_scope = []
    rec = Record(task.case, task.backend, out_of_scope=out_of_scope,
                 engine=task.engine_crashed or partial.get("engine", Outcome("skipped")),
                 engine_source="verdicts" if task.verdict is not None and task.engine_crashed is None else "inline")
    if stage == "engine recheck":  # npurt is done; the raw engine died confirming a verdict-file verdict
        rec.npurt, rec.execute = partial.get("run", Outcome("skipped")), partial.get("execute", Outcome("skipped"))
        rec.engine, rec.engine_source = failed, "inline"
    elif stage == "npurt:execute":
        rec.npurt, rec.execute = partial.get("run", Outcome("skipped")), failed
    else:
        rec.npurt = failed
    return rec


def run_cases(names: Sequence[str], backends: Sequence[str], jobs: int | None = None,
              verdicts: dict[str, dict[str, Outcome] | None] | None = None, timeout_s: float = CASE_TIMEOUT_S,
              root: Path | None = None, progress: Callable[[int, int], None] | None = None) -> list[Record]:
    """Every (case, backend) through worker processes; one record each, crashes and hangs included."""
    root = case_store.materialize(root)
    verdicts = verdicts or {}
    tasks: deque[Task] = deque(
        Task(name, b, (verdicts.get(b) or {}).get(name)) for name in names for b in backends)
    total = len(tasks)
    jobs = max(1, min(jobs or os.cpu_count() or 1, total or 1))
    ctx = multiprocessing.get_context("spawn")
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="npurt-conformance-") as log_dir:
        serial = 0
        available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        shares = [available[k::jobs] for k in range(jobs)] if jobs > 1 and len(available) >= jobs else []

        def spawn(slot: int) -> _Worker:
            nonlocal serial
            serial += 1
            return _Worker(ctx, root, Path(log_dir), serial, slot, shares[slot] if shares else None)

        workers = [spawn(k) for k in range(jobs)]
        idle = list(workers)
        busy: list[_Worker] = []
        try:
            while tasks or busy:
                while tasks and idle:
                    w = idle.pop()
                    w.give(tasks.popleft())
                    busy.append(w)
                now = time.monotonic()
                deadline = min(w.started + timeout_s for w in busy)
                ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                             timeout=max(0.0, deadline - now))
                for w in list(busy):
                    lost = ""
                    try:
                        while w.conn.poll():
                            kind, payload = w.conn.recv()
                            if kind == "ready":
                                w.ready = True
                            elif kind == "stage":
                                w.stage = payload
                            elif kind != "record":
                                w.partial[kind] = payload
                            elif kind == "record":
                                records.append(payload)
                                busy.remove(w)
                                idle.append(w)
                                break
                    except (EOFError, OSError):
                        lost = "crash"
                    if w not in busy:
                        continue
                    if not lost and w.process.sentinel in ready and not w.process.is_alive():
                        lost = "crash"
                    if not lost and time.monotonic() - w.started > timeout_s:
                        lost = "hang"
                    if not lost:
                        continue
                    if lost == "hang":
                        w.process.kill()
                    w.process.join(5)
                    assert w.task is not None
                    if not w.ready and lost == "crash":
                        # it died before taking any case: the harness is broken here, not a case
                        raise RuntimeError(f"a conformance worker died while starting ({_death(w.process.exitcode)})"
                                           f": {w.log_tail('')}")
                    what = (f"no result after {timeout_s:.0f} s" if lost == "hang"
                            else _death(w.process.exitcode))
                    tail = w.log_tail(w.task.case)
                    reason = _one_line(f"{what} in stage {w.stage!r}" + (f"; stderr: {tail}" if tail else ""), 400)
                    busy.remove(w)
                    workers.remove(w)
                    replacement = spawn(w.slot)
                    workers.append(replacement)
                    idle.append(replacement)
                    if w.stage == "engine" and "engine" not in w.partial:
                        # the raw engine itself crashed or hung: that is its verdict; npurt still runs the case
                        w.task.engine_crashed = Outcome(lost, reason, "run")
                        tasks.appendleft(w.task)
                        continue
                    records.append(_record_of_lost(w.task, w.stage, w.partial, Outcome(lost, reason, w.stage), root))
                if progress is not None:
                    progress(len(records), total)
        finally:
            for w in workers:
                w.stop()
    order = {(n, b): k for k, (n, b) in enumerate((n, b) for n in names for b in backends)}
    records.sort(key=lambda r: order.get((r.case, r.backend), 0))
    return records


# ------------------------------------------------------------------------------------------- reporting
def counts(records: Sequence[Record], backend: str) -> dict[str, Any]:
    mine = [r for r in records if r.backend == backend]
    diffs = differences(mine)
    in_scope = [r for r in mine if not r.out_of_scope]
    return {
        "cases": len(mine),
        "out_of_scope": len(mine) - len(in_scope),
        "engine_passes": sum(r.engine.status == "pass" for r in mine),
        "npurt_passes": sum(r.npurt.status == "pass" and r.execute.status in ("pass", "skipped") for r in mine),
        "npurt_refuses": sum(r.npurt.status == "refused" for r in mine),
        "differences": len(diffs),
        "by_category": dict(Counter(d.category for d in diffs).most_common()),
        "engine_source": dict(Counter(r.engine_source for r in mine)),
        "notes": [f"{r.case}: {r.note}" for r in mine if r.note],
    }


def report(records: Sequence[Record], backends: Sequence[str], list_differences: bool = True) -> str:
    lines = []
    for b in backends:
        c = counts(records, b)
        lines.append(f"{b}: {c['cases']} cases ({c['out_of_scope']} out of scope), engine passes "
                     f"{c['engine_passes']}, npurt passes {c['npurt_passes']} (refuses {c['npurt_refuses']}), "
                     f"differences {c['differences']}; engine verdicts from {c['engine_source']}")
        for category, k in c["by_category"].items():
            lines.append(f"    {k:5d}  {category}")
        for note in c["notes"]:
            lines.append(f"    note: {note}")
    if list_differences:
        for d in differences(r for r in records if r.backend in backends):
            lines.append(str(d))
    return "\n".join(lines)


def docs_table(records: Sequence[Record], backends: Sequence[str], seconds: float, jobs: int) -> str:
    import onnx

    rows = ["| backend (engine) | cases | out of scope | engine passes | npurt passes | differences |",
            "|---|---:|---:|---:|---:|---:|"]
    cats = []
    for b in backends:
        c = counts(records, b)
        rows.append(f"| {RUNNER_TYPE[b]} ({ENGINE_NAME[b]} {engine_version(b).split('-')[0]}) | {c['cases']} | "
                    f"{c['out_of_scope']} | {c['engine_passes']} | {c['npurt_passes']} | {c['differences']} |")
        cats.append(f"- {RUNNER_TYPE[b]}: " + (", ".join(f"{cat} {k}" for cat, k in c["by_category"].items())
                                               or "no differences"))
    return "\n".join([
        f"Generated by `python -m tests.conformance.harness --write-verdicts` with onnx {onnx.__version__}, "
        f"{jobs} worker processes, {seconds:.0f} s on this machine (both engines inline). Engine and npurt "
        "passes: outputs match ONNX's expected ones (npurt: from run() and from execute()); differences: cases "
        "that break the rule above.", "", *rows, "", "Differences by category:", "", *cats])


def update_docs(table: str, path: Path = DOCS) -> None:
    text = path.read_text() if path.exists() else f"# Conformance\n\n{DOCS_BEGIN}\n{DOCS_END}\n"
    if DOCS_BEGIN not in text or DOCS_END not in text:
        text = text.rstrip("\n") + f"\n\n{DOCS_BEGIN}\n{DOCS_END}\n"
    head, rest = text.split(DOCS_BEGIN, 1)
    _, tail = rest.split(DOCS_END, 1)
    path.write_text(f"{head}{DOCS_BEGIN}\n{table}\n{DOCS_END}{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.harness", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both", *OPT_IN_BACKENDS), default="both",
                        help="both: vaiml and openvino; qnn (opt-in): ONNX Runtime + QNN EP on the HTP emulator")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("-k", dest="substring", default="", help="only cases whose name contains this")
    parser.add_argument("--limit", type=int, default=0, help="only the first N cases (after -k and --offset)")
    parser.add_argument("--offset", type=int, default=0, help="skip the first N cases (after -k)")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--write-verdicts", action="store_true",
                        help="run the engines inline and write their verdicts and docs/conformance.md's table")
    parser.add_argument("--report", action="store_true", help="print counts and every difference")
    parser.add_argument("--json", type=Path, help="write every record here")
    args = parser.parse_args(argv)
    if args.write_verdicts and (args.substring or args.limit or args.offset):
        parser.error("--write-verdicts needs every case (no -k, --limit or --offset)")
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    if args.write_verdicts and any(b in OPT_IN_BACKENDS for b in backends):
        parser.error("--write-verdicts: the QNN column compares with the raw EP inline, it has no verdict file")
    names = list(case_store.iter_cases(substring=args.substring))
    names = names[args.offset:args.offset + args.limit] if args.limit else names[args.offset:]
    verdicts = {} if args.write_verdicts else {b: load_verdicts(b) for b in backends if b not in OPT_IN_BACKENDS}
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\r{done}/{total}", end="", file=sys.stderr, flush=True)

    records = run_cases(names, backends, args.jobs, verdicts, args.timeout, progress=progress)
    seconds = time.perf_counter() - t0
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"{len(records)} records in {seconds:.1f} s with {args.jobs} workers")
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in records], indent=0))
    if args.write_verdicts:
        for b in backends:
            print(f"wrote {write_verdicts(records, b)}")
        update_docs(docs_table(records, backends, seconds, args.jobs))
        print(f"updated {DOCS}")
    print(report(records, backends, list_differences=args.report))
    return 1 if differences(records) else 0


if __name__ == "__main__":
    sys.exit(main())
