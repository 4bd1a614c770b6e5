"""npurt.bench, the measurement engine: its loops, a fresh process's memory figures, the typed results and the one
formatter, the subjects on real runners and engines."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from npurt import RunnerFactory, TensorType
from npurt.bench import (
    Budget,
    CallSubject,
    LatencyStats,
    Report,
    RunnerSubject,
    Table,
    Target,
    ThroughputStats,
    engine_floor,
    in_fresh_process,
    keep_in_flight,
    measure_latency,
    measure_throughput,
    paired_difference_ms,
    paired_ratio,
    random_feeds,
    render,
)
from npurt.bench.compare import Keeper
from npurt.bench.loads import load_onnxruntime, load_openvino
from npurt.bench.subjects import RawOnnxRuntimeSubject, RawOpenVINOSubject
from npurt.models import default_model_path

DIGITS = {"image": ((4, 1, 8, 8), "float32")}


def test_budget_checks_and_splits():
    with pytest.raises(ValueError):
        Budget(niter=None, time_s=None)
    with pytest.raises(ValueError):
        Budget(niter=0)
    block = Budget(niter=25, time_s=None, blocks=10).per_block()
    assert block.niter == 3 and block.blocks == 1 and block.warmup == 0
    assert Budget(niter=None, time_s=2.0, blocks=4).per_block().time_s == 0.5


def test_latency_blocks_rotate_and_keep_exactly_niter_samples():
    calls: list[str] = []
    subjects = [CallSubject(name, lambda name=name: calls.append(name)) for name in "abc"]
    stats = measure_latency(subjects, Budget(niter=7, time_s=None, warmup=1, blocks=3, settle=1))
    assert [s.count for s in stats] == [7, 7, 7]
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    starts = []  # the subject that opens each block: a, then b, then c
    rest = calls[3:]
    per_block = 1 + 3  # settle + ceil(7 / 3)
    for k in range(3):
        starts.append(rest[k * 3 * per_block])
    assert starts == ["a", "b", "c"]


def test_latency_measures_what_takes_longer():
    short, long = measure_latency([CallSubject("short", lambda: time.sleep(0.0005)),
                                   CallSubject("long", lambda: time.sleep(0.003))],
                                  Budget(niter=20, time_s=None, warmup=0))
    assert long.p50_ms > short.p50_ms + 1.5
    assert 1.5 < paired_difference_ms(long, short) < 6
    assert short.min_ms <= short.p50_ms <= short.p90_ms <= short.p99_ms <= short.max_ms


def test_percentiles_match_numpy():
    samples = [int(x) for x in np.random.default_rng(0).integers(1_000, 1_000_000, 101)]
    stats = LatencyStats.from_samples(samples)
    ms = np.asarray(samples) / 1e6
    assert stats.p50_ms == pytest.approx(np.percentile(ms, 50))
    assert stats.p99_ms == pytest.approx(np.percentile(ms, 99))
    assert stats.mean_ms == pytest.approx(ms.mean())


def test_paired_ratio_is_the_median_of_block_ratios():
    a = ThroughputStats(1, 0, 1.0, 0.0, (10.0, 20.0, 30.0))
    b = ThroughputStats(1, 0, 1.0, 0.0, (10.0, 10.0, 10.0))
    assert paired_ratio(a, b) == 2.0
    assert paired_ratio(a, ThroughputStats(1, 0, 1.0, 0.0, (0.0, 0.0, 0.0))) is None


def test_render_and_exit_code_follow_the_targets():
    table = Table(["what", "ms"], formats=["", "{:.2f}"])
    table.add("a", 1.2345)
    table.add("b", None)
    report = Report("title", tables=[table], targets=[Target("ratio", 1.01, 1.03)])
    text = render(report)
    assert "1.23" in text and " -" in text and text.endswith("targets met") and report.exit_code == 0
    report.targets.append(Target("speed-up", 9.0, 10.0, at_most=False, unit="x"))
    assert report.exit_code == 1
    assert render(report).splitlines()[-1] == "targets missed (1): speed-up 9x (target >= 10x)"
    data = json.loads(render(report, as_json=True))
    assert data["missed"] == ["speed-up 9x (target >= 10x)"] and data["targets"][1]["met"] is False


def test_fresh_process_reports_the_memory_a_call_adds():
    run = in_fresh_process(allocate, mib=64)  # loaded by file in the child
    assert run.value == {"allocated": 64}
    assert 60 <= run.rss_added_mib <= 80, run
    assert run.peak_added_mib >= run.rss_added_mib - 1
    assert run.import_ms > 0 and run.rss_after_imports_mib > 5


def allocate(probe, mib: int) -> dict:
    """In a fresh process: 64 MiB touched and kept to the end."""
    probe.keep(np.ones(mib * 2**20, np.uint8))
    return {"allocated": mib}


def test_fresh_process_failure_is_one_error():
    from npurt.bench import BenchError

    with pytest.raises(BenchError, match="in a fresh process failed"):
        in_fresh_process("tests.test_bench_engine:no_such_function")


@pytest.fixture(scope="module")
def digits_feeds() -> dict[str, np.ndarray]:
    return random_feeds(DIGITS, seed=1)


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_runner_and_raw_subjects_on_a_dynamic_model(backend, digits_feeds):
    if backend not in RunnerFactory.available_backends():
        pytest.skip(f"{backend} not installed")
    with RunnerFactory.create_runner(backend, default_model_path(), {"device": "CPU", "max_concurrent_runs": 2}) as r:
        subject = RunnerSubject(r, digits_feeds, requests=2)  # the ports are dynamic: the feeds give the shapes
        assert [t.info.shape for t in subject.ins] == [(4, 1, 8, 8)]
        assert [t.info.shape for t in subject.outs] == [(4, 10)]
        subject.step()
        expected = r.run(digits_feeds)["scores"]
        np.testing.assert_allclose(subject.outs[0].numpy(), expected, rtol=1e-6)
        done, seconds = keep_in_flight(r, subject.sets, Budget(niter=9, time_s=None))
        assert done == 9 and seconds > 0
        floor = engine_floor(r, subject.ins, subject.outs)
        subject.outs[0].numpy()[...] = 0
        floor.step()  # the runner's own engine writes the runner's tensors
        np.testing.assert_allclose(subject.outs[0].numpy(), expected, rtol=1e-6)

        keeper = Keeper()
        inputs = {"image": [[4, 1, 8, 8], "float32"]}
        if backend == "OPENVINO":
            figures = load_openvino(keeper, str(default_model_path()), "CPU",
                                    dict(r.device_info.engine_settings), inputs)
            raw = RawOpenVINOSubject(keeper.kept[0], digits_feeds, requests=2)
        else:
            figures = load_onnxruntime(keeper, str(default_model_path()), inputs)
            raw = RawOnnxRuntimeSubject(keeper.kept[0], digits_feeds, requests=2)
        assert figures["load_ms"] > 0 and figures["first_inference_ms"] > 0
        try:
            a, b = measure_throughput([subject, raw], Budget(niter=20, time_s=None, warmup=1, blocks=4))
            assert a.count == b.count == 20 and len(a.block_fps) == len(b.block_fps) == 4
            assert paired_ratio(a, b) > 0
        finally:
            raw.close()


def test_npu_views_of_a_dynamic_model_need_pinned_shapes(digits_feeds):
    if "OPENVINO" not in RunnerFactory.available_backends():
        pytest.skip("OPENVINO not installed")
    with RunnerFactory.create_runner("OPENVINO", default_model_path(),
                                     {"device": "CPU", "hw_view": "npu", "shapes": {"image": [4, 1, 8, 8]}}) as r:
        subject = RunnerSubject(r, digits_feeds, tensor_type=TensorType.HW)
        assert subject.ins[0].info.describe() == "HW [4, 8, 8, 1] FP16 NHWC"
        subject.step()
        np.testing.assert_allclose(subject.outs[0].numpy().astype(np.float32), r.run(digits_feeds)["scores"],
                                   atol=2e-2)
