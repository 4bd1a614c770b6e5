"""RunnerType.OPENVINO on the real OpenVINO CPU plugin with the PP-OCR models (small shapes, to stay fast)."""

from __future__ import annotations

import functools
import threading
import warnings

import numpy as np
import openvino as ov
import pytest

from models import model_or_skip
from npurt import (
    NpuError,
    NpuFallbackWarning,
    NpuTensor,
    RunnerFactory,
    RunnerType,
    StatusCode,
    TensorDirection,
    TensorType,
)
from npurt.backends.openvino import OpenVINORunner, core
from ocr import SHAPES, frame, ocr_runner
from procstat import pool_workers


def make(model: str, **options) -> OpenVINORunner:
    runner = ocr_runner(RunnerType.OPENVINO, model, **options)
    assert isinstance(runner, OpenVINORunner)
    return runner


def to_hw(x: np.ndarray) -> np.ndarray:
    """The OPENVINO HW view of a float CPU tensor: NHWC for 4-D, FP16."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1) if x.ndim == 4 else x).astype(np.float16)


def from_hw(y: np.ndarray) -> np.ndarray:
    return (y.transpose(0, 3, 1, 2) if y.ndim == 4 else y).astype(np.float32)


@functools.cache
def raw_compiled(model: str, shape: tuple[int, ...]) -> ov.CompiledModel:
    m = core().read_model(str(model_or_skip(model)))
    m.reshape({m.input(0): ov.PartialShape(list(shape))})
    return core().compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


def raw_openvino(model: str, x: np.ndarray) -> np.ndarray:
    """The plain OpenVINO call: read, reshape, compile with the runner's CPU settings (f32), infer."""
    return raw_compiled(model, x.shape).create_infer_request().infer({0: x})[0].copy()


def tensors(runner, view: TensorType, x: np.ndarray | None = None):
    ins = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.INPUT, view)]
    outs = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.OUTPUT, view)]
    if x is not None:
        ins[0].numpy()[...] = to_hw(x) if view is TensorType.HW else x
    return ins, outs


def execute(runner, ins, outs) -> None:
    status = runner.execute([ins], [outs])
    assert status is StatusCode.SUCCESS, runner.last_error


@pytest.fixture(scope="module")
def cls_hw():
    with make("ocr_cls") as r:
        yield r


@pytest.fixture(scope="module")
def cls_cpu():
    with make("ocr_cls", input_tensor_type="CPU", output_tensor_type="CPU") as r:
        yield r


# ------------------------------------------------------------------ views and results
@pytest.mark.parametrize("model", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_hw_and_cpu_ports_match_raw_openvino(model):
    x = frame(SHAPES[model], seed=1)
    x16 = x.astype(np.float16).astype(np.float32)  # what a HW (FP16) input holds
    with make(model) as hw, make(model, input_tensor_type="CPU", output_tensor_type="CPU") as cpu:
        # CPU ports: the model's own view, bit for bit what plain OpenVINO computes with the same settings
        ins, outs = tensors(cpu, TensorType.CPU, x)
        execute(cpu, ins, outs)
        np.testing.assert_array_equal(outs[0].numpy(), raw_openvino(model, x))
        assert cpu.stats["copies"] == 0

        # HW ports: NHWC FP16 in and out, converted inside the compiled model
        hw_in = hw.get_tensors_info(TensorDirection.INPUT)[0]
        assert hw_in.shape == (x.shape[0], x.shape[2], x.shape[3], x.shape[1])
        ins, outs = tensors(hw, TensorType.HW, x)
        execute(hw, ins, outs)
        assert outs[0].numpy().dtype == np.float16
        raw_hw = hw.compiled_model.create_infer_request().infer({0: to_hw(x)})[0]
        np.testing.assert_array_equal(outs[0].numpy(), raw_hw)  # the same compiled model, called directly
        np.testing.assert_allclose(from_hw(outs[0].numpy()), raw_openvino(model, x16), rtol=2e-3, atol=2e-3)
        assert hw.stats["copies"] == 0

        # the other view on each runner: converted into a staging buffer, one counted copy per tensor
        ins_c, outs_c = tensors(hw, TensorType.CPU, x)
        execute(hw, ins_c, outs_c)
        np.testing.assert_allclose(outs_c[0].numpy(), from_hw(outs[0].numpy()), rtol=0, atol=0)
        assert hw.stats["copies"] == 2
        assert hw.stats["bytes_copied"] == ins[0].nbytes + outs_c[0].nbytes  # bytes written: HW in, CPU out


def test_run_convenience_matches_raw(cls_hw):
    x = frame(SHAPES["ocr_cls"], seed=2)
    got = cls_hw.run({"x": x})
    [name] = got
    assert name == "save_infer_model/scale_0.tmp_1"  # the ONNX graph's output name
    np.testing.assert_allclose(got[name], raw_openvino("ocr_cls", x.astype(np.float16).astype(np.float32)),
                               rtol=2e-3, atol=2e-3)


def test_zero_copy_by_address_identity(cls_hw, cls_cpu):
    for runner, view in ((cls_hw, TensorType.HW), (cls_cpu, TensorType.CPU)):
        before = runner.stats["copies"]
        ins, outs = tensors(runner, view, frame(SHAPES["ocr_cls"], seed=3))
        for _ in range(3):
            execute(runner, ins, outs)
        compiled = runner.compiled_model
        [request] = runner.infer_requests()  # one request: calls from one thread reuse it
        assert request.get_tensor(compiled.input(0)).data.ctypes.data == ins[0].get_virtual_address()
        assert request.get_tensor(compiled.output(0)).data.ctypes.data == outs[0].get_virtual_address()
        assert runner.stats["copies"] == before

    # a user's own numpy arrays on CPU ports go in place too
    x = frame(SHAPES["ocr_cls"], seed=4)
    y = np.zeros((1, 2), np.float32)
    info_in, info_out = cls_cpu.get_tensor_info_by_name("x", TensorType.CPU), cls_cpu.get_tensors_info(
        TensorDirection.OUTPUT, TensorType.CPU)[0]
    before = cls_cpu.stats["copies"]
    execute(cls_cpu, [NpuTensor(info_in, x)], [NpuTensor(info_out, y)])
    [request] = cls_cpu.infer_requests()
    assert request.get_tensor(cls_cpu.compiled_model.input(0)).data.ctypes.data == x.ctypes.data
    assert request.get_tensor(cls_cpu.compiled_model.output(0)).data.ctypes.data == y.ctypes.data
    assert cls_cpu.stats["copies"] == before
    np.testing.assert_array_equal(y, raw_openvino("ocr_cls", x))


def test_rebinding_follows_new_memory(cls_cpu):
    """A new tensor on a port is bound again (the pool must not keep feeding the old memory)."""
    results = []
    for seed in (5, 6):
        x = frame(SHAPES["ocr_cls"], seed=seed)
        ins, outs = tensors(cls_cpu, TensorType.CPU, x)
        execute(cls_cpu, ins, outs)
        np.testing.assert_array_equal(outs[0].numpy(), raw_openvino("ocr_cls", x))
        results.append(outs[0].numpy().copy())
    assert not np.array_equal(results[0], results[1])


# ------------------------------------------------------------------ shapes
def test_dynamic_model_without_shapes_names_the_dims():
    with pytest.raises(ValueError, match=r"input 'x' has dynamic dim 2, dim 3.*shapes="):
        RunnerFactory.create_runner("OPENVINO", model_or_skip("ocr_cls"), {"device": "CPU"})


def test_shapes_reshape_and_shape_cache():
    with make("ocr_rec") as runner:
        assert runner.input_specs[0].shape == (None, 3, None, None)
        assert runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0].shape == (1, 3, 48, 320)
        assert runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0].shape == (1, 40, 6625)
        assert runner.stats["compiles"] == 1
        narrow = frame((1, 3, 48, 160), seed=7)
        first = runner.run({"x": narrow})["softmax_11.tmp_0"]
        assert first.shape == (1, 20, 6625)
        assert runner.stats["compiles"] == 2
        again = runner.run({"x": narrow})["softmax_11.tmp_0"]
        runner.run({"x": frame((1, 3, 48, 320), seed=8)})
        assert runner.stats["compiles"] == 2  # both shapes reuse their compiled models
        np.testing.assert_array_equal(first, again)
        np.testing.assert_allclose(first, raw_openvino("ocr_rec", narrow.astype(np.float16).astype(np.float32)),
                                   rtol=2e-3, atol=2e-3)
        assert len(runner.infer_requests([(1, 3, 48, 160)])) == 1

        # a shape the model cannot take is a clear INVALID_INPUT, not a crash
        bad_info = runner.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=(1, 4, 48, 320))
        _, outs = tensors(runner, TensorType.CPU)
        status = runner.execute([[NpuTensor(bad_info, np.zeros(bad_info.shape, np.float32))]], [outs])
        assert status is StatusCode.INVALID_INPUT
        assert "x" in runner.last_error and "[1, 4, 48, 320]" in runner.last_error


# ------------------------------------------------------------------ async and threads
@pytest.mark.parametrize("order", ["submission", "completion"])
def test_execute_async_callbacks(order):
    n = 6
    with make("ocr_cls", max_concurrent_runs=2, callback_order=order, input_tensor_type="CPU",
              output_tensor_type="CPU") as runner:
        assert runner.max_concurrent_runs == 2
        xs = [frame(SHAPES["ocr_cls"], seed=10 + k) for k in range(n)]
        sets = [tensors(runner, TensorType.CPU, x) for x in xs]
        seen: list[tuple[int, StatusCode]] = []
        done = threading.Event()

        def callback(handle):
            seen.append((handle.job_id, handle.status))
            if len(seen) == n:
                done.set()

        ids = []
        for ins, outs in sets:
            while True:
                job = runner.execute_async([ins], [outs], callback)
                if job.status is not StatusCode.RESOURCE_UNAVAILABLE:
                    break
                threading.Event().wait(0.001)  # all requests busy: transient, retry
            assert job.status is StatusCode.SUCCESS, runner.last_error
            ids.append(job.job_id)
        assert done.wait(60)
        assert all(status is StatusCode.SUCCESS for _, status in seen)
        if order == "submission":
            assert [job_id for job_id, _ in seen] == ids
        else:
            assert sorted(job_id for job_id, _ in seen) == ids
        for x, (_, outs) in zip(xs, sets):
            np.testing.assert_array_equal(outs[0].numpy(), runner.run({"x": x})["save_infer_model/scale_0.tmp_1"])
        assert len(runner.infer_requests()) <= 2


def test_execute_async_without_callback_runs_on_the_engines_requests():
    """Jobs without a callback start on OpenVINO's own infer requests (start_async): no runner thread, the
    same results, statuses from wait (polling included), and close() lets the ones in flight end."""
    workers_before = pool_workers()
    runner = make("ocr_rec", max_concurrent_runs=2)
    xs = [frame(SHAPES["ocr_rec"], seed=30 + k) for k in range(6)]
    sets = [tensors(runner, TensorType.HW, x) for x in xs]
    expected = []
    for ins, outs in sets:
        execute(runner, ins, outs)
        expected.append(outs[0].numpy().copy())
        outs[0].numpy()[...] = 0
    jobs = []
    for ins, outs in sets:
        while (job := runner.execute_async([ins], [outs])).status is StatusCode.RESOURCE_UNAVAILABLE:
            assert runner.wait(jobs[0], 10000) is StatusCode.SUCCESS, runner.last_error  # the oldest
            jobs.pop(0)
        assert job.status is StatusCode.SUCCESS, runner.last_error
        polled = runner.wait(job, 0)
        assert polled in (StatusCode.JOB_PENDING, StatusCode.SUCCESS), runner.last_error
        if polled is StatusCode.JOB_PENDING:  # a poll that finds the job done collects it
            jobs.append(job)
    for job in jobs:
        assert runner.wait(job, 10000) is StatusCode.SUCCESS, runner.last_error
    for (_, outs), want in zip(sets, expected):
        np.testing.assert_array_equal(outs[0].numpy(), want)
    assert pool_workers() == workers_before  # no runner thread ran them
    assert len(runner.infer_requests()) <= 2 and runner.stats["copies"] == 0
    # execute() after execute_async also runs on OpenVINO's executor (mixing infer() and start_async() grows
    # OpenVINO's memory under load): same results
    ins, outs = sets[0]
    outs[0].numpy()[...] = 0
    execute(runner, ins, outs)
    np.testing.assert_array_equal(outs[0].numpy(), expected[0])
    in_flight = [runner.execute_async([ins], [outs]) for ins, outs in sets[:2]]
    runner.close()
    assert [runner.wait(j, 0) for j in in_flight] == [StatusCode.SUCCESS] * 2
    stats = runner.stats
    assert stats["jobs_submitted"] == stats["jobs_completed"] == 8 and stats["jobs_failed"] == 0


def test_execute_while_async_jobs_hold_every_request_does_not_hang():
    """Jobs started on the engine keep their infer request until the runner sees them end: an execute()
    that finds every request held by such (ended, unwaited) jobs must get one back, not wait forever."""
    with make("ocr_cls", max_concurrent_runs=2, input_tensor_type="CPU", output_tensor_type="CPU") as runner:
        sets = [tensors(runner, TensorType.CPU, frame(SHAPES["ocr_cls"], seed=40 + k)) for k in range(3)]
        jobs = [runner.execute_async([ins], [outs]) for ins, outs in sets[:2]]
        assert [j.status for j in jobs] == [StatusCode.SUCCESS] * 2, runner.last_error
        statuses = []
        worker = threading.Thread(target=lambda: statuses.append(runner.execute([sets[2][0]], [sets[2][1]])),
                                  daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "execute() waited forever for an infer request"
        assert statuses == [StatusCode.SUCCESS], runner.last_error
        assert [runner.wait(j, 10000) for j in jobs] == [StatusCode.SUCCESS] * 2
        assert len(runner.infer_requests()) <= 2


def test_eight_threads_share_one_runner(cls_hw):
    xs = [frame(SHAPES["ocr_cls"], seed=20 + k) for k in range(8)]
    expected = []
    for x in xs:
        ins, outs = tensors(cls_hw, TensorType.HW, x)
        execute(cls_hw, ins, outs)
        expected.append(outs[0].numpy().copy())
    errors: list[str] = []
    results: dict[int, list[np.ndarray]] = {}

    def worker(k: int) -> None:
        ins, outs = tensors(cls_hw, TensorType.HW, xs[k])
        results[k] = []
        for _ in range(5):
            if cls_hw.execute([ins], [outs]) is not StatusCode.SUCCESS:
                errors.append(cls_hw.last_error)
            results[k].append(outs[0].numpy().copy())

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(8):
        for got in results[k]:
            np.testing.assert_array_equal(got, expected[k])


# ------------------------------------------------------------------ devices
@pytest.mark.skipif(OpenVINORunner.npu_present(), reason="this machine has an NPU")
def test_npu_request_falls_back_or_raises():
    with pytest.warns(NpuFallbackWarning, match="NPU requested"):
        runner = make("ocr_cls", device="NPU")
    with runner:
        info = runner.device_info
        assert (info.requested, info.attached, info.fell_back, info.engine) == ("NPU", "CPU", True, "OpenVINO")
        assert "no 'NPU' in OpenVINO's available_devices" in info.reason
        assert "/dev/accel" in info.reason and "intel_vpu" in info.reason
        # HW views follow the target, not the device a fallback attached
        assert runner.get_tensors_info(TensorDirection.INPUT)[0].shape == (1, 48, 192, 3)
        assert runner.compile_properties["INFERENCE_PRECISION_HINT"] == "f32"  # CPU defaults apply on CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NpuError, match="NPU is not available.*intel_vpu"):
            make("ocr_cls", device="NPU", fallback="error")


def test_auto_takes_what_is_there():
    with make("ocr_cls", device="AUTO") as runner:
        info = runner.device_info
        assert not info.fell_back
        if not OpenVINORunner.npu_present():
            assert info.attached != "NPU"
            assert dict(info.skipped)["NPU"].startswith("no 'NPU'")


# ------------------------------------------------------------------ properties and caching
def test_properties_and_engine_options_pass_through():
    with make("ocr_cls", performance_hint="THROUGHPUT", engine_options={"NUM_STREAMS": 2}) as runner:
        compiled = runner.compiled_model
        assert str(compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
        assert int(compiled.get_property("NUM_STREAMS")) == 2
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
        assert runner.max_concurrent_runs == int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    with pytest.raises(NpuError, match="NOT_A_PROPERTY"):
        make("ocr_cls", engine_options={"NOT_A_PROPERTY": "1"})


def test_cache_dir_second_runner_loads_from_cache(tmp_path):
    cache = tmp_path / "ovcache"
    x = frame(SHAPES["ocr_cls"], seed=30)
    with make("ocr_cls", cache_dir=cache) as first:
        y1 = first.run({"x": x})
    blobs = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert blobs, "OpenVINO wrote nothing to cache_dir"
    with make("ocr_cls", cache_dir=cache) as second:
        assert second.compile_properties["CACHE_DIR"] == str(cache)
        y2 = second.run({"x": x})
    # a cache hit imports the blob and writes nothing new
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == blobs
    for name in y1:
        np.testing.assert_array_equal(y1[name], y2[name])


def test_openvino_ir_model(tmp_path, cls_cpu):
    xml = tmp_path / "cls.xml"
    ov.save_model(core().read_model(str(model_or_skip("ocr_cls"))), str(xml), compress_to_fp16=False)
    x = frame(SHAPES["ocr_cls"], seed=40)
    with RunnerFactory.create_runner("OPENVINO", xml, {"device": "CPU", "shapes": {"x": list(SHAPES["ocr_cls"])},
                                                      "input_tensor_type": "CPU", "output_tensor_type": "CPU"}) as ir:
        assert [p.name for p in ir.output_specs] == [p.name for p in cls_cpu.output_specs]
        got = ir.run({"x": x})
    want = cls_cpu.run({"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_unreadable_model_is_a_clear_error(tmp_path):
    bogus = tmp_path / "bogus.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(NpuError, match="OpenVINO cannot read the model .*bogus.onnx"):
        RunnerFactory.create_runner("OPENVINO", bogus, {"device": "CPU"})
