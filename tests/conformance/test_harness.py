"""The conformance harness itself: its judging, its rule, and that crashes and hangs are pinned to one case."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conformance import cases, harness
from tests.conformance.harness import Outcome, Record


def test_judge_uses_onnx_tolerances_and_nan_equal_nan() -> None:
    e = np.array([1.0, np.nan, np.inf, 0.0], np.float32)
    assert harness.judge(e, e + np.array([1e-3 * 0.9, 0, 0, 9e-6], np.float32)) == ""
    assert "1 of 4 values off" in harness.judge(e, e + np.array([2e-3, 0, 0, 0], np.float32))
    assert "1 of 4 values off" in harness.judge(e, np.array([1.0, 0.0, np.inf, 0.0], np.float32))
    assert "dtype float64" in harness.judge(e, e.astype(np.float64))
    assert "shape [1, 4]" in harness.judge(e, e.reshape(1, 4))
    assert "values differ" in harness.judge(np.arange(3), np.array([0, 1, 3]))
    assert harness.judge([e, e], [e, e]) == "" and "sequence" in harness.judge([e], e)


def test_the_qnn_column_judges_at_fp16s_tolerance() -> None:
    e = np.array([1.0, 100.0, 0.0], np.float32)
    fp16 = e.astype(np.float16).astype(np.float32) + np.array([4e-3, 0.5, 5e-4], np.float32)
    assert "values off" in harness._judge_all([e], [fp16], ["y"], "vaiml")
    assert harness._judge_all([e], [fp16], ["y"], "qnn") == ""
    assert "values off" in harness._judge_all([e], [e * np.float32(1.02)], ["y"], "qnn")


def test_identical_is_bit_exact_but_nan_equal() -> None:
    a = np.array([1.0, np.nan], np.float32)
    assert harness.identical([a], [a.copy()])
    assert not harness.identical([a], [a + np.float32(1e-7)])  # within tolerance, not identical
    assert not harness.identical([a], [a.astype(np.float64)])


def rec(backend: str, engine: str, npurt: Outcome, execute: Outcome | None = None, **kw) -> Record:
    return Record("test_x", backend, engine=Outcome(engine), npurt=npurt,
                  execute=execute or Outcome("skipped"), **kw)


REFUSED = Outcome("refused", "NpuError: output 'y' stays dynamic", "load", "npurt.types.NpuError")


@pytest.mark.parametrize("record, category", [
    (rec("openvino", "pass", Outcome("pass")), None),
    (rec("openvino", "pass", REFUSED), "refused: dynamic output"),
    (rec("openvino", "fail", REFUSED), None),
    (rec("openvino", "fail", Outcome("fail", "wrong")), None),
    (rec("openvino", "error", Outcome("escaped", "RuntimeError: x", "run", "RuntimeError")), "raw exception escaped"),
    (rec("openvino", "pass", Outcome("pass"), Outcome("unwritten", "sentinel")), "unwritten output"),
    (rec("openvino", "fail", Outcome("crash", "SIGSEGV", "npurt:run")), "crash"),
    (rec("vaiml", "pass", Outcome("pass"), same_as_engine=True), None),
    (rec("vaiml", "pass", Outcome("pass"), same_as_engine=False), "not bit-exact with ONNX Runtime"),
    (rec("vaiml", "fail", Outcome("fail", "off"), same_as_engine=True), None),
    (rec("vaiml", "fail", Outcome("fail", "off"), same_as_engine=False), "differs from the engine's wrong result"),
    (rec("vaiml", "error", Outcome("pass")), "result where the engine errors"),
    (rec("vaiml", "error", REFUSED), None),
    # the QNN column: the raw EP's results, bit for bit, where npurt returns any
    (rec("qnn", "pass", Outcome("pass"), same_as_engine=True), None),
    (rec("qnn", "pass", Outcome("pass"), same_as_engine=False), "not bit-exact with ONNX Runtime + QNN EP"),
    (rec("qnn", "pass", REFUSED), "refused: dynamic output"),
    (rec("qnn", "error", REFUSED), None),
    (rec("qnn", "error", Outcome("pass")), "result where the engine errors"),
    (rec("vaiml", "pass", Outcome("exception", "ValueError: input 'x' has dynamic dim 1", "run", "ValueError")),
     "dynamic input (ValueError)"),
    # out of scope: refused at load naming the port, or passing, is fine; another refusal is not
    (rec("vaiml", "pass", Outcome("refused", "NpuUnsupportedError: input 's' is not a tensor", "load",
                                  "npurt.types.NpuUnsupportedError"), out_of_scope=["sequence port 's'"]), None),
    (rec("vaiml", "error", Outcome("pass"), out_of_scope=["BFLOAT16 port 'y'"]), None),
    (rec("vaiml", "pass", Outcome("refused", "NpuError: engine said no", "load", "npurt.types.NpuError"),
         out_of_scope=["sequence port 's'"]),
     "out of scope, not refused at load as NpuUnsupportedError naming the port"),
])
def test_the_rule(record: Record, category: str | None) -> None:
    diffs = harness.differences([record])
    assert [d.category for d in diffs] == ([] if category is None else [category])


@pytest.mark.slow
@pytest.mark.conformance
def test_crashes_and_hangs_are_pinned_to_one_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faults injected into the workers (a segfault in npurt's load, an abort in the raw engine, a hang in
    npurt's run) end as records of exactly those cases; the replaced workers finish the rest."""
    monkeypatch.setenv(harness.FAULT_ENV, "test_abs@npurt:load=segv,test_add@engine=abort,test_sub@npurt:run=hang")
    names = ["test_abs", "test_add", "test_sub", "test_mul", "test_neg"]
    records = harness.run_cases(names, ["vaiml"], jobs=2, timeout_s=8)
    by_case = {r.case: r for r in records}
    assert sorted(by_case) == sorted(names)
    assert by_case["test_abs"].npurt.status == "crash" and "SIGSEGV" in by_case["test_abs"].npurt.reason
    assert by_case["test_abs"].npurt.stage == "npurt:load"
    # the raw engine's crash is its verdict; npurt then ran the case in a fresh worker and returned outputs
    assert by_case["test_add"].engine.status == "crash" and "SIGABRT" in by_case["test_add"].engine.reason
    assert by_case["test_add"].npurt.status == "pass"
    assert by_case["test_sub"].npurt.status == "hang" and by_case["test_sub"].npurt.stage == "npurt:run"
    for name in ("test_mul", "test_neg"):
        assert by_case[name].engine.status == "pass" and by_case[name].npurt.status == "pass"
    assert {d.case: d.category for d in harness.differences(records)} == {
        "test_abs": "crash", "test_add": "result where the engine errors", "test_sub": "hang"}


def test_cases_read_back_with_their_ports() -> None:
    case = cases.load_case("test_identity_sequence")
    assert case.out_of_scope == ["sequence port 'x'", "sequence port 'y'"]
    assert isinstance(case.feeds["x"], list) and all(isinstance(a, np.ndarray) for a in case.feeds["x"])
    case = cases.load_case("test_abs")
    assert case.out_of_scope == [] and case.feeds["x"].dtype == np.float32 and len(case.expected) == 1
