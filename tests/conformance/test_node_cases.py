"""Every ONNX backend node case of the installed onnx through npurt, differentially against the engines.

One test per backend; each lists every difference (case, category, reason) when it fails. The rule is
``harness._difference``'s, explained in docs/conformance.md. OpenVINO's own verdicts come from the verdict
file for the installed versions where there is one (differences are re-checked against OpenVINO inline),
else they are computed inline; ONNX Runtime always runs inline (its outputs are compared bit for bit).
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conformance import cases, harness

pytestmark = [pytest.mark.slow, pytest.mark.conformance]

_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def suite_cases(backend: str, names: list[str]) -> list[str]:
    """The cases the suite runs on ``backend``: every one on ONNX Runtime (~3 ms a case); on OpenVINO (~35 ms a case,
    its compile_model) not the ``_expanded`` ones, each its twin's function written out in other nodes: npurt's part
    of a case (its inputs and outputs) is its twin's, and the graph between them is the engine's. The harness's
    script runs them all (docs/conformance.md)."""
    if backend != "openvino":
        return names
    known = set(names)
    return [n for n in names if not (_EXPANDED.search(n) and _EXPANDED.sub("", n) in known)]


@pytest.mark.parametrize("backend", harness.BACKENDS)
def test_node_cases_match_the_engine(backend: str) -> None:
    every = cases.case_names()
    assert len(every) > 1000, f"only {len(every)} node cases in {cases.cache_dir()}"
    names = suite_cases(backend, every)
    assert len(names) > 1000, f"only {len(names)} of {len(every)} node cases for {backend}"
    verdicts = {backend: harness.load_verdicts(backend)}
    records = harness.run_cases(names, [backend], jobs=os.cpu_count(), verdicts=verdicts)
    assert len(records) == len(names)
    counts = harness.counts(records, backend)
    # A harness that silently judged nothing would pass: most cases must go through both sides.
    assert counts["engine_passes"] > len(names) // 2, counts
    diffs = harness.differences(records)
    summary = (f"{backend}: {len(diffs)} of {len(names)} node cases break the rule (engine passes "
               f"{counts['engine_passes']}, npurt passes {counts['npurt_passes']}); by category "
               f"{counts['by_category']}")
    assert not diffs, summary + "\n" + "\n".join(str(d) for d in diffs)


def test_the_qnn_column_on_a_slice() -> None:
    """The opt-in QNN column (``--backend qnn``: ONNX Runtime + QNN EP on the HTP emulator against npurt's QNN
    runner on the NPU) on a slice spread over the cases; the whole column is a script run (docs/devices.md)."""
    from tests.helpers.qnn import require_qnn

    require_qnn()
    names = cases.case_names()
    spread = names[:: len(names) // 24][:24]
    records = harness.run_cases(spread, ["qnn"], jobs=min(2, os.cpu_count() or 1))
    assert len(records) == len(spread)
    counts = harness.counts(records, "qnn")
    assert counts["engine_passes"] > len(spread) // 3, counts  # the raw EP runs most of them on the HTP
    diffs = harness.differences(records)
    assert not diffs, "\n".join(str(d) for d in diffs)
