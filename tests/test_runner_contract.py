"""The execution contract of Runner, on the numpy test backend (y = a*x + b): every StatusCode it returns."""

import threading
import time

import numpy as np
import pytest

from npurt import (
    DataType,
    JobHandle,
    MemoryLayout,
    NpuError,
    NpuTensor,
    NpuTensorInfo,
    RunnerFactory,
    StatusCode,
    TensorDirection,
    TensorType,
)
from tests.helpers.procstat import pool_workers


@pytest.fixture(params=[False, True], ids=["workers", "engine_async"])
def runner(axpy_model, request):
    """A runner whose async jobs run on the runner's workers, or on the engine's own requests."""
    with RunnerFactory.create_runner("AXPY", axpy_model(engine_async=request.param),
                                     {"input_tensor_type": "CPU", "output_tensor_type": "CPU"}) as r:
        yield r


# Inputs that make the numpy test engine fail, the status each becomes, and a piece of its message.
ENGINE_ERRORS = [
    (np.nan, StatusCode.RUNTIME_ERROR, "engine failure"),
    (np.inf, StatusCode.UNSUPPORTED, "not supported"),
    (-np.inf, StatusCode.OUT_OF_MEMORY, "out of memory"),
]


def cpu_io(runner, value=1.0, batch=1):
    x_info = runner.get_tensor_info_by_name("x", TensorType.CPU)
    y_info = runner.get_tensor_info_by_name("y", TensorType.CPU)
    xs = [NpuTensor(x_info, np.full(x_info.shape, value, np.float32)) for _ in range(batch)]
    ys = [NpuTensor(y_info, np.zeros(y_info.shape, np.float32)) for _ in range(batch)]
    return [[x] for x in xs], [[y] for y in ys]


# -- factory and options ------------------------------------------------------------------------------
def test_unknown_runner_type_lists_the_valid_ones(axpy_model):
    with pytest.raises(ValueError, match=r"unknown runner type 'NOPE'.*AXPY"):
        RunnerFactory.create_runner("NOPE", axpy_model())


@pytest.mark.parametrize("options, match", [
    ({"colour": "red"}, r"unknown option 'colour'; valid options: device, fallback"),
    ({"device": "TPU"}, r"'device': 'TPU' is not one of AUTO, NPU, CPU, GPU"),
    ({"batch_size": 0}, "positive integer"),
    ({"callback_order": "random"}, "submission, completion"),
    ({"input_tensor_type": "GPU"}, "HW, CPU"),
    ({"input_tensor_type.nope": "CPU"}, "no input 'nope'"),
    ({"shapes": {"x": [1, -3]}}, "integers >= 0"),
    ({"hw_view": "gpu"}, "device, npu"),
    ({"max_compiled_shapes": 0}, "positive integer"),
    ({"hw_format": {"x": {"memory_layout": "ZZZ"}}}, "not a MemoryLayout"),
])
def test_bad_options_raise_value_error(axpy_model, options, match):
    with pytest.raises(ValueError, match=match):
        RunnerFactory.create_runner("AXPY", axpy_model(), options)


def test_missing_model_file_raises(tmp_path):
    with pytest.raises(ValueError, match="model file not found"):
        RunnerFactory.create_runner("AXPY", tmp_path / "missing.json")


# -- queries ---------------------------------------------------------------------------------------------
def test_queries(runner):
    assert runner.get_num_input_tensors() == 1 and runner.get_num_output_tensors() == 1
    assert runner.get_batch_size() == 1
    (x_cpu,) = runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)
    assert x_cpu.shape == (1, 3, 4, 4) and x_cpu.memory_layout is MemoryLayout.NCHW
    assert x_cpu.tensor_type is TensorType.CPU and x_cpu.direction is TensorDirection.INPUT
    (y_hw,) = runner.get_tensors_info(TensorDirection.OUTPUT)
    assert y_hw.tensor_type is TensorType.HW and y_hw.direction is TensorDirection.OUTPUT
    assert runner.get_quant_parameters("x") is None
    with pytest.raises(ValueError, match=r"no tensor named 'z'.*\['x'\].*\['y'\]"):
        runner.get_tensor_info_by_name("z")
    assert runner.device_info.attached == "CPU"


def test_hw_view_is_the_attached_devices_unless_npu_views_are_asked_for(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(target="VAIML")) as r:  # on CPU: the model's own view
        assert r.get_tensor_info_by_name("x") == r.get_tensor_info_by_name("x", TensorType.CPU).replace(
            tensor_type=TensorType.HW)
        assert r.device_info.hw_view == "device"
    for options, model in (({"hw_view": "npu"}, {}), ({}, {"device": "NPU"})):
        with RunnerFactory.create_runner("AXPY", axpy_model(target="VAIML", **model), options) as r:
            hw = r.get_tensor_info_by_name("x")
            assert hw.shape == (4, 1, 4, 1, 4) and hw.data_type is DataType.BF16
            assert hw.memory_layout is MemoryLayout.HCWNC4
            assert r.device_info.hw_view == "npu" and r.device_info.shape_mode == "static"


# -- execute -----------------------------------------------------------------------------------------------
def test_execute_success_cpu_ports(runner):
    ins, outs = cpu_io(runner, 3.0)
    assert runner.execute(ins, outs) is StatusCode.SUCCESS
    assert np.all(outs[0][0].numpy() == 7.0)
    assert runner.last_error == ""
    assert runner.stats["copies"] == 0  # CPU tensors on CPU-configured ports: no conversion


def test_hw_ports_zero_copy_and_cpu_tensors_converted_once_each(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(target="OPENVINO"), {"hw_view": "npu"}) as r:
        x_hw, y_hw = r.get_tensor_info_by_name("x"), r.get_tensor_info_by_name("y")
        assert x_hw.memory_layout is MemoryLayout.NHWC and x_hw.data_type is DataType.FP16
        x, y = r.allocate_npu_tensor(x_hw), r.allocate_npu_tensor(y_hw)
        src = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
        x.numpy()[...] = src.transpose(0, 2, 3, 1).astype(np.float16)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
        assert r.stats["copies"] == 0 and r.stats["bytes_copied"] == 0
        expected = 2 * src.astype(np.float16).astype(np.float32) + 1
        np.testing.assert_allclose(y.numpy().transpose(0, 3, 1, 2).astype(np.float32), expected, rtol=1e-3)
        # the same run fed from CPU views: one conversion in, one out, counted
        xc = NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU), src)
        yc = NpuTensor(r.get_tensor_info_by_name("y", TensorType.CPU), np.zeros((1, 3, 4, 4), np.float32))
        assert r.execute([[xc]], [[yc]]) is StatusCode.SUCCESS
        assert r.stats["copies"] == 2 and r.stats["bytes_copied"] == x_hw.size_in_bytes + 48 * 4
        np.testing.assert_allclose(yc.numpy(), expected, rtol=1e-3)


def test_batch_slots(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(), {"batch_size": 2, "input_tensor_type": "CPU",
                                                            "output_tensor_type": "CPU"}) as r:
        ins, outs = cpu_io(r, 1.0, batch=2)
        ins[1][0].numpy()[...] = 5.0
        assert r.execute(ins, outs) is StatusCode.SUCCESS
        assert outs[0][0].numpy().max() == 3.0 and outs[1][0].numpy().max() == 11.0
        ins3, outs3 = cpu_io(r, 1.0, batch=3)
        assert r.execute(ins3, outs3) is StatusCode.INVALID_INPUT
        assert "1 to 2" in r.last_error


def bad_input_cases(runner):
    x_info = runner.get_tensor_info_by_name("x", TensorType.CPU)
    y_info = runner.get_tensor_info_by_name("y", TensorType.CPU)
    good_x = NpuTensor(x_info, np.ones(x_info.shape, np.float32))
    good_y = NpuTensor(y_info, np.zeros(y_info.shape, np.float32))
    wrong_name = NpuTensor(x_info.replace(name="q"), np.ones(x_info.shape, np.float32))
    wrong_shape = NpuTensor(x_info.replace(shape=(1, 3, 4, 5)), np.ones((1, 3, 4, 5), np.float32))
    wrong_dtype = NpuTensor(x_info.replace(data_type=DataType.INT32), np.ones(x_info.shape, np.int32))
    ro = np.zeros(y_info.shape, np.float32)
    ro.flags.writeable = False
    read_only_out = NpuTensor(y_info.replace(direction=TensorDirection.INPUT), ro)
    return [
        ([[good_x, good_x]], [[good_y]], StatusCode.INVALID_INPUT, "2 input tensors given"),
        ([[]], [[good_y]], StatusCode.INVALID_INPUT, "0 input tensors"),
        ([[wrong_name]], [[good_y]], StatusCode.INVALID_INPUT, "unknown names ['q']"),
        ([[wrong_shape]], [[good_y]], StatusCode.INVALID_INPUT, "does not fit input 'x' of shape [1, 3, 4, 4]"),
        ([[wrong_dtype]], [[good_y]], StatusCode.INVALID_INPUT, "data_type is INT32, expected FLOAT32"),
        ([["not a tensor"]], [[good_y]], StatusCode.INVALID_INPUT, "is not an NpuTensor"),
        ([], [], StatusCode.INVALID_INPUT, "0 batch slots"),
        ("x", [[good_y]], StatusCode.INVALID_INPUT, "list (batch) of lists"),
        ([[good_x]], [[good_y, good_y]], StatusCode.INVALID_OUTPUT, "2 output tensors given"),
        ([[good_x]], [[read_only_out]], StatusCode.INVALID_OUTPUT, "read-only"),
        ([[good_x]], [[good_x]], StatusCode.INVALID_OUTPUT, "no output tensor for 'y'"),
    ]


def test_execute_invalid_input_and_output(runner):
    for ins, outs, status, message in bad_input_cases(runner):
        assert runner.execute(ins, outs) is status, message
        assert message in runner.last_error, (message, runner.last_error)


@pytest.mark.parametrize("value, status, message", ENGINE_ERRORS)
def test_engine_errors_become_status_codes(runner, value, status, message):
    ins, outs = cpu_io(runner, value)
    assert runner.execute(ins, outs) is status
    assert message in runner.last_error
    ok_ins, ok_outs = cpu_io(runner, 1.0)
    assert runner.execute(ok_ins, ok_outs) is StatusCode.SUCCESS  # the runner lives on


def test_last_error_is_per_thread(runner):
    ins, outs = cpu_io(runner, np.nan)
    assert runner.execute(ins, outs) is StatusCode.RUNTIME_ERROR
    seen = []
    t = threading.Thread(target=lambda: seen.append(runner.last_error))
    t.start()
    t.join()
    assert seen == [""] and "engine failure" in runner.last_error


# -- async ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine_async", [False, True])
def test_async_wait_statuses(axpy_model, engine_async):
    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=300, engine_async=engine_async),
                                     {"input_tensor_type": "CPU",
                                     "output_tensor_type": "CPU", "max_concurrent_runs": 1}) as r:
        ins, outs = cpu_io(r, 2.0)
        job = r.execute_async(ins, outs)
        assert job.status is StatusCode.SUCCESS and job.job_id == 1
        assert r.wait(job, 0) is StatusCode.JOB_PENDING
        assert r.wait(job, 10) is StatusCode.JOB_PENDING
        busy = r.execute_async(ins, outs)
        assert busy == JobHandle(StatusCode.RESOURCE_UNAVAILABLE, 0)
        assert "busy" in r.last_error
        assert r.wait(job, -5) is StatusCode.INVALID_INPUT
        assert r.wait(job, 5000) is StatusCode.SUCCESS
        assert np.all(outs[0][0].numpy() == 5.0)
        assert r.wait(job, 0) is StatusCode.INVALID_JOB_ID  # collected
        assert r.wait(JobHandle(StatusCode.SUCCESS, 0), 0) is StatusCode.INVALID_JOB_ID
        assert r.wait(12345, 0) is StatusCode.INVALID_JOB_ID
        assert r.wait("job", 0) is StatusCode.INVALID_JOB_ID
        job2 = r.execute_async(ins, outs)
        assert job2.job_id == 2
        assert r.wait(job2) is StatusCode.SUCCESS


@pytest.mark.parametrize("value, status, message", ENGINE_ERRORS)
def test_async_failure_status_and_message_reach_the_waiter(runner, value, status, message):
    ins, outs = cpu_io(runner, value)
    job = runner.execute_async(ins, outs)
    assert job.status is StatusCode.SUCCESS  # accepted; the engine's error is the job's status
    assert runner.wait(job, 5000) is status
    assert message in runner.last_error
    assert runner.stats["jobs_failed"] == 1
    bad = runner.execute_async([[]], outs)
    assert bad.status is StatusCode.INVALID_INPUT and bad.job_id == 0


def test_wait_on_another_runners_job(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(), {"input_tensor_type": "CPU",
                                                            "output_tensor_type": "CPU"}) as a, \
            RunnerFactory.create_runner("AXPY", axpy_model()) as b:
        ins, outs = cpu_io(a)
        job = a.execute_async(ins, outs)
        assert b.wait(job, 100) is StatusCode.INVALID_JOB_ID
        assert a.wait(job, 5000) is StatusCode.SUCCESS


@pytest.mark.parametrize("order", ["submission", "completion"])
def test_callback_order(axpy_model, order):
    opts = {"input_tensor_type": "CPU", "output_tensor_type": "CPU", "max_concurrent_runs": 4,
            "callback_order": order}
    with RunnerFactory.create_runner("AXPY", axpy_model(delay_from_input=True), opts) as r:
        seen, done = [], threading.Event()

        def callback(handle):
            seen.append(handle)
            if len(seen) == 4:
                done.set()

        jobs = []
        for delay in (400, 250, 100, 0):  # later jobs finish first
            ins, outs = cpu_io(r, float(delay))
            jobs.append(r.execute_async(ins, outs, callback))
            assert jobs[-1].status is StatusCode.SUCCESS
        assert done.wait(10)
        ids = [h.job_id for h in seen]
        assert all(h.status is StatusCode.SUCCESS for h in seen)
        if order == "submission":
            assert ids == [j.job_id for j in jobs]
        else:
            assert ids == [j.job_id for j in reversed(jobs)]
        time.sleep(0.05)
        # a job with a callback is released after its callback returns
        assert r.wait(jobs[0], 0) is StatusCode.INVALID_JOB_ID


def test_raising_callback_is_logged_and_worker_lives(runner, caplog):
    ins, outs = cpu_io(runner)
    got = threading.Event()

    def bad(handle):
        raise RuntimeError("callback bug")

    assert runner.execute_async(ins, outs, bad).status is StatusCode.SUCCESS
    assert runner.execute_async(ins, outs, lambda h: got.set()).status is StatusCode.SUCCESS
    assert got.wait(5)
    assert "callback of job 1 raised" in caplog.text
    assert runner.execute_async(ins, outs, "not callable").status is StatusCode.INVALID_INPUT


# -- shapes ------------------------------------------------------------------------------------------------------
def test_dynamic_dims_run_any_size_on_a_dynamic_device(axpy_model):
    path = axpy_model(shape=[None, 3, None, 4])
    with RunnerFactory.create_runner("AXPY", path) as r:
        assert r.device_info.shape_mode == "dynamic"
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        assert x_info.shape == (-1, 3, -1, 4) and not x_info.is_static and x_info.size_in_bytes == -1
        with pytest.raises(ValueError, match=r"dynamic dims \(0, 2\).*replace\(shape="):
            r.allocate_npu_tensor(x_info)
        for n, h in ((1, 2), (3, 5), (2, 7)):
            out = r.run({"x": np.full((n, 3, h, 4), 1.0, np.float32)})["y"]
            assert out.shape == (n, 3, h, 4) and np.all(out == 3.0)
        # execute(): the output tensor is large enough; result_info says what the run wrote
        x = NpuTensor(x_info.replace(shape=(2, 3, 3, 4)), np.full((2, 3, 3, 4), 2.0, np.float32))
        big = r.get_tensor_info_by_name("y", TensorType.CPU).replace(shape=(2, 3, 9, 4))
        y = r.allocate_npu_tensor(big)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
        assert y.result_info.shape == (2, 3, 3, 4) and np.all(y.result() == 5.0) and y.info.shape == (2, 3, 9, 4)
        small = NpuTensor(big.replace(shape=(1, 3, 1, 4)), np.zeros((1, 3, 1, 4), np.float32))
        assert r.execute([[x]], [[small]]) is StatusCode.INVALID_OUTPUT
        assert "[2, 3, 3, 4]" in r.last_error
        assert r.stats["compiles"] == 1  # one engine for every shape
        with pytest.raises(ValueError, match="does not fit"):
            r.run({"x": np.ones((1, 5, 6, 4), np.float32)})


def test_static_devices_compile_each_shape_once_in_a_bounded_lru(axpy_model):
    path = axpy_model(shape=[None, 3, None, 4], dynamic=False)
    with pytest.raises(ValueError, match="does not fit input 'x'"):
        RunnerFactory.create_runner("AXPY", path, {"shapes": {"x": [1, 4, 8, 4]}})
    with RunnerFactory.create_runner("AXPY", path, {"max_compiled_shapes": 2}) as r:
        assert r.device_info.shape_mode == "static" and r.stats["compiles"] == 0  # nothing pins a shape yet
        assert r.get_tensor_info_by_name("x", TensorType.CPU).shape == (-1, 3, -1, 4)
        for h in (1, 2, 1, 3, 1, 2):
            assert r.run({"x": np.ones((1, 3, h, 4), np.float32)})["y"].shape == (1, 3, h, 4)
        assert r.stats["compiles"] == 4  # 1, 2, 3 (drops 2: least recently used), 2 again
    with RunnerFactory.create_runner("AXPY", path, {"shapes": [{"x": [1, 3, 8, 4]}, {"x": [2, 3, 8, 4]}],
                                                     "input_tensor_type": "CPU", "output_tensor_type": "CPU"}) as r:
        assert r.get_tensor_info_by_name("y", TensorType.CPU).shape == (1, 3, 8, 4)
        assert r.stats["compiles"] == 2  # both given signatures, ahead
        r.run({"x": np.ones((2, 3, 8, 4), np.float32)})
        assert r.stats["compiles"] == 2
        feeds = {"x": np.ones((1, 3, 6, 4), np.float32)}
        for _ in range(3):  # a new shape compiles once, then is reused
            assert r.run(feeds)["y"].shape == (1, 3, 6, 4)
        assert r.stats["compiles"] == 3
        with pytest.raises(ValueError, match="does not fit"):
            r.run({"x": np.ones((1, 5, 6, 4), np.float32)})


def test_pinned_shapes_on_a_dynamic_device_share_one_dynamic_engine_for_the_rest(axpy_model):
    path = axpy_model(shape=[None, 3, None, 4])
    with RunnerFactory.create_runner("AXPY", path, {"shapes": {"x": [1, 3, 8, 4]}}) as r:
        assert r.stats["compiles"] == 1 and r.get_tensor_info_by_name("x").shape == (1, 3, 8, 4)
        for h in (2, 3, 4):
            r.run({"x": np.ones((1, 3, h, 4), np.float32)})
        assert r.stats["compiles"] == 2  # the pinned shape's engine, and one dynamic engine for the others


def test_run_convenience(runner):
    out = runner.run({"x": np.full((1, 3, 4, 4), 2.0, np.float32)})
    assert np.all(out["y"] == 5.0)
    with pytest.raises(ValueError, match="dtype float64"):
        runner.run({"x": np.ones((1, 3, 4, 4))})
    with pytest.raises(ValueError, match=r"missing inputs \['x'\]"):
        runner.run({})
    with pytest.raises(NpuError, match="RUNTIME_ERROR"):
        runner.run({"x": np.full((1, 3, 4, 4), np.nan, np.float32)})


# -- lifecycle ---------------------------------------------------------------------------------------------------
def test_close_ends_pending_jobs_and_refuses_new_work(axpy_model):
    r = RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=200), {"input_tensor_type": "CPU",
                                    "output_tensor_type": "CPU", "max_concurrent_runs": 4,
                                    "async_threadpool_depth": 1})
    ins, outs = cpu_io(r)
    jobs = [r.execute_async(ins, outs) for _ in range(3)]
    assert all(j.status is StatusCode.SUCCESS for j in jobs)
    deadline = time.monotonic() + 10
    while r.backend.active == 0 and time.monotonic() < deadline:  # the first job is on the (one) worker
        time.sleep(0.005)
    r.close()
    statuses = [r.wait(j, 1000) for j in jobs]
    assert statuses[0] is StatusCode.SUCCESS  # it was running
    assert StatusCode.FAILURE in statuses[1:]  # queued behind it: ended by close
    assert "closed" in r.last_error or statuses.count(StatusCode.FAILURE) >= 1
    assert r.execute(ins, outs) is StatusCode.FAILURE and "closed" in r.last_error
    assert r.execute_async(ins, outs).status is StatusCode.FAILURE
    with pytest.raises(NpuError, match="closed"):
        r.get_tensors_info(TensorDirection.INPUT)
    r.close()  # idempotent


def test_engine_requests_run_jobs_without_callbacks(axpy_model):
    """With a backend that has async requests of its own, jobs without a callback and without conversions
    start on them (no runner thread); the rest go to the workers; ended jobs free their run unseen."""
    workers_before = pool_workers()
    r = RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=100, engine_async=True),
                                    {"input_tensor_type": "CPU", "output_tensor_type": "CPU",
                                     "max_concurrent_runs": 2})
    ins, outs = cpu_io(r, 1.0)
    ins2, outs2 = cpu_io(r, 2.0)
    jobs = [r.execute_async(ins, outs), r.execute_async(ins2, outs2)]
    assert [j.status for j in jobs] == [StatusCode.SUCCESS] * 2
    assert r.backend.started == 2 and pool_workers() == workers_before
    assert r.execute_async(ins, outs).status is StatusCode.RESOURCE_UNAVAILABLE  # both still running
    # Nobody waits, yet both jobs are seen to end (stats asks the engine) and their runs are free again.
    deadline = time.monotonic() + 10
    while r.stats["jobs_completed"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.stats["jobs_completed"] == 2
    third = r.execute_async(ins, outs)
    assert third.status is StatusCode.SUCCESS and r.backend.started == 3
    assert [r.wait(j, 5000) for j in (*jobs, third)] == [StatusCode.SUCCESS] * 3
    assert np.all(outs[0][0].numpy() == 3.0) and np.all(outs2[0][0].numpy() == 5.0)
    assert r.wait(third, 0) is StatusCode.INVALID_JOB_ID  # collected

    # A job with a callback starts on the engine too; its callback runs on a runner thread.
    seen = []
    job = r.execute_async(ins, outs, seen.append)
    assert r.wait(job, 5000) is StatusCode.SUCCESS and r.backend.started == 4
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [JobHandle(StatusCode.SUCCESS, job.job_id)]

    # Two threads waiting on one engine job: both see its status.
    job = r.execute_async(ins, outs)
    statuses = []
    waiters = [threading.Thread(target=lambda: statuses.append(r.wait(job, 5000))) for _ in range(2)]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join()
    assert StatusCode.SUCCESS in statuses and set(statuses) <= {StatusCode.SUCCESS, StatusCode.INVALID_JOB_ID}

    # close() lets engine jobs in flight end, and they keep their status.
    jobs = [r.execute_async(ins, outs), r.execute_async(ins2, outs2)]
    r.close()
    assert [r.wait(j, 0) for j in jobs] == [StatusCode.SUCCESS] * 2
    assert r.stats["jobs_submitted"] == r.stats["jobs_completed"] == 7


def test_threads_share_one_runner(runner):
    expected = {v: 2 * v + 1 for v in range(8)}
    errors = []

    def work(v):
        ins, outs = cpu_io(runner, float(v))
        for _ in range(50):
            if runner.execute(ins, outs) is not StatusCode.SUCCESS:
                errors.append(runner.last_error)
            if not np.all(outs[0][0].numpy() == expected[v]):
                errors.append(f"thread {v}: wrong result")
            job = runner.execute_async(ins, outs)
            if job.status is StatusCode.SUCCESS and runner.wait(job, 5000) is not StatusCode.SUCCESS:
                errors.append(runner.last_error)

    threads = [threading.Thread(target=work, args=(v,)) for v in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_hw_tensor_info_wrong_view_is_reported(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(target="OPENVINO"), {"hw_view": "npu"}) as r:
        x_hw = r.get_tensor_info_by_name("x")
        wrong = NpuTensorInfo(name="x", data_type=DataType.FP16, shape=(1, 3, 4, 4), tensor_type=TensorType.HW,
                              memory_layout=MemoryLayout.NCHW)
        x = r.allocate_npu_tensor(wrong)
        y = r.allocate_npu_tensor(r.get_tensor_info_by_name("y"))
        assert r.execute([[x]], [[y]]) is StatusCode.INVALID_INPUT
        assert "HW shape [1, 3, 4, 4], expected [1, 4, 4, 3]" in r.last_error
        assert x_hw.shape == (1, 4, 4, 3)


def test_run_keeps_scalar_inputs_scalar(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(shape=[]), {"input_tensor_type": "CPU",
                                                                    "output_tensor_type": "CPU"}) as r:
        assert r.run({"x": np.array(2.0, np.float32)})["y"] == 5.0


def test_cached_plans_do_not_keep_frames_alive(runner):
    import gc
    import weakref

    ins, outs = cpu_io(runner, 1.0)
    assert runner.execute(ins, outs) is StatusCode.SUCCESS
    assert runner.execute(ins, outs) is StatusCode.SUCCESS  # from the plan cache
    frame = weakref.ref(ins[0][0])
    del ins
    gc.collect()
    assert frame() is None  # a new frame per call must not pile up in the runner
    ins2, _ = cpu_io(runner, 3.0)
    assert runner.execute(ins2, outs) is StatusCode.SUCCESS and np.all(outs[0][0].numpy() == 7.0)



def test_a_cached_plan_answers_only_for_its_own_tensors(runner):
    """The plan cache hits by the tensors' ids: a tensor of a cached set swapped for a bad one, or a bad tensor made
    after a cached one was collected (which may take its id), fails exactly as a set never seen does."""
    import gc

    ins, outs = cpu_io(runner, 1.0)
    x_info, y_info = ins[0][0].info, outs[0][0].info
    for _ in range(2):  # validated once, then from the cache
        assert runner.execute(ins, outs) is StatusCode.SUCCESS
        job = runner.execute_async(ins, outs)
        assert job.status is StatusCode.SUCCESS and runner.wait(job, 5000) is StatusCode.SUCCESS

    def bad_x():
        return NpuTensor(x_info.replace(shape=(1, 3, 4, 5)), np.zeros((1, 3, 4, 5), np.float32))

    # what a set never seen gets
    assert runner.execute([[bad_x()]], outs) is StatusCode.INVALID_INPUT
    expected_in = runner.last_error
    assert "shape [1, 3, 4, 5] does not fit" in expected_in
    bad_y = NpuTensor(y_info.replace(data_type=DataType.INT32), np.zeros(y_info.shape, np.int32))
    assert runner.execute(ins, [[bad_y]]) is StatusCode.INVALID_OUTPUT
    expected_out = runner.last_error

    # one tensor of the cached set swapped (the same list objects, mutated)
    good_x = ins[0][0]
    ins[0][0] = bad_x()
    assert runner.execute(ins, outs) is StatusCode.INVALID_INPUT and runner.last_error == expected_in
    job = runner.execute_async(ins, outs)
    assert job == JobHandle(StatusCode.INVALID_INPUT, 0) and runner.last_error == expected_in
    ins[0][0] = good_x
    good_y, outs[0][0] = outs[0][0], bad_y
    assert runner.execute(ins, outs) is StatusCode.INVALID_OUTPUT and runner.last_error == expected_out
    outs[0][0] = good_y
    assert runner.execute(ins, outs) is StatusCode.SUCCESS  # the good set still runs from the cache

    # slots that index but are not lists of tensors (the one-tensor key indexes them) are refused as before
    for slot in ({"x": ins[0][0]}, {0: ins[0][0]}, "x"):
        assert runner.execute([slot], outs) is StatusCode.INVALID_INPUT, slot
        assert runner.execute_async([slot], outs).status is StatusCode.INVALID_INPUT

    # the cached input collected: bad tensors made now may take its id, and none passes
    cached_id = id(good_x)
    del good_x, ins
    gc.collect()
    candidates = [bad_x() for _ in range(64)]
    for t in sorted(candidates, key=lambda t: id(t) != cached_id):  # one with the old id (if any) first
        assert runner.execute([[t]], outs) is StatusCode.INVALID_INPUT and runner.last_error == expected_in


def test_infer_queue_slots_callbacks_and_failures(axpy_model):
    from npurt import InferQueue

    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=20), {"max_concurrent_runs": 2,
                                                                        "callback_order": "completion"}) as r:
        queue = InferQueue(r, jobs=2)
        seen = []
        queue.set_callback(lambda slot, k: seen.append((k, slot.status, slot.error, slot.results()["y"].copy())))
        for k in range(6):
            queue.start_async({"x": np.full((1, 3, 4, 4), float(k), np.float32)}, userdata=k)
        queue.start_async({"x": np.full((1, 3, 4, 4), np.nan, np.float32)}, userdata="bad")
        assert queue.wait_all(10)
        by_key = {k: (status, error, y) for k, status, error, y in seen}
        for k in range(6):
            assert by_key[k][0] is StatusCode.SUCCESS and np.all(by_key[k][2] == 2 * k + 1)
        assert by_key["bad"][0] is StatusCode.RUNTIME_ERROR and "NaN" in by_key["bad"][1]
        with pytest.raises(ValueError, match="missing inputs"):
            queue.start_async({})
    with RunnerFactory.create_runner("AXPY", axpy_model(shape=[None, 3, 4, 4])) as r:
        with pytest.raises(ValueError, match="output_shapes"):
            InferQueue(r)
        InferQueue(r, output_shapes={"y": (4, 3, 4, 4)})


def test_infer_queue_slots_beyond_the_runs_wait_and_start_as_jobs_end(axpy_model):
    """The default queue has more slots than the runner's runs: the slots beyond them wait (start_async does not
    block) and are started as jobs end, never more at once than the runner runs; closing the runner ends the
    waiting ones with FAILURE through their callbacks (none is lost)."""
    from npurt import InferQueue

    def x(k):
        return np.full((1, 3, 4, 4), float(k), np.float32)

    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=200), {"max_concurrent_runs": 2,
                                                                         "callback_order": "completion"}) as r:
        queue = InferQueue(r)
        assert len(queue) == 6
        seen = {}
        queue.set_callback(lambda slot, k: seen.__setitem__(k, (slot.status, slot.results()["y"].copy())))
        for k in range(6):
            queue.start_async({"x": x(k)}, userdata=k)
        assert not queue.is_ready() and r.stats["jobs_submitted"] == 2  # two run, four wait for a run
        for k in range(6, 10):
            queue.start_async({"x": x(k)}, userdata=k)
        assert queue.wait_all(30)
        assert r.stats["jobs_submitted"] == 10 and sorted(seen) == list(range(10))
        for k, (status, y) in seen.items():
            assert status is StatusCode.SUCCESS and np.all(y == 2 * k + 1)
    r = RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=200), {"max_concurrent_runs": 1,
                                                                        "callback_order": "completion"})
    queue = InferQueue(r)
    statuses = {}
    queue.set_callback(lambda slot, k: statuses.__setitem__(k, slot.status))
    for k in range(2):
        queue.start_async({"x": x(k)}, userdata=k)
    r.close()
    assert queue.wait_all(30)
    assert statuses == {0: StatusCode.SUCCESS, 1: StatusCode.FAILURE}


def test_infer_queue_waiting_slots_run_next_on_the_worker_that_ended_a_job(axpy_model):
    """A waiting slot is the next job of the worker whose job ended (its callback submits it as a continuation):
    one worker runs them all, no spare worker is started for them, and user callbacks that submit still get one."""
    from npurt import InferQueue

    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=20), {"max_concurrent_runs": 1,
                                                                        "callback_order": "completion"}) as r:
        queue = InferQueue(r)
        threads = []
        queue.set_callback(lambda slot, k: threads.append(threading.current_thread().name))
        for k in range(len(queue)):
            queue.start_async({"x": np.full((1, 3, 4, 4), float(k), np.float32)}, userdata=k)
        assert queue.wait_all(30)
        assert len(threads) == len(queue) and len(set(threads)) == 1
        assert [t.name for t in r._core.jobs.threads()] == threads[:1]
        # a user callback that submits keeps a spare worker for the queued job (it may wait for it)
        ins, outs = cpu_io(r, 1.0)
        ended = threading.Event()
        r.execute_async(ins, outs, callback=lambda h: r.wait(r.execute_async(ins, outs, callback=lambda _: ended.set()),
                                                              10_000))
        assert ended.wait(10)
        assert len(r._core.jobs.threads()) == 2


def test_a_callbacks_submission_runs_next_on_its_worker_with_no_spare_woken(axpy_model):
    """AsyncInferQueue's contract: the job a callback submits is its worker's next job (a continuation): a chain of
    jobs, each submitted by the previous one's callback, runs on one worker and no other worker starts."""
    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=2), {"max_concurrent_runs": 1,
                                                                       "callback_order": "completion"}) as r:
        ins, outs = cpu_io(r, 1.0)
        ran_on, done, left = [], threading.Event(), [12]

        def chain(handle):
            ran_on.append(threading.current_thread().name)
            left[0] -= 1
            if left[0] == 0 or handle.status is not StatusCode.SUCCESS:
                done.set()
            else:
                assert r.execute_async(ins, outs, callback=chain).status is StatusCode.SUCCESS

        assert r.execute_async(ins, outs, callback=chain).status is StatusCode.SUCCESS
        assert done.wait(30)
        assert len(ran_on) == 12 and len(set(ran_on)) == 1
        assert [t.name for t in r._core.jobs.threads()] == ran_on[:1]


@pytest.mark.parametrize("how", ["wait", "wait_any"])
def test_a_callback_that_submits_and_waits_through_npurt_does_not_deadlock(axpy_model, how):
    """A callback that waits (through npurt) for the job it submitted hands that job, its worker's continuation, to
    another worker first: the wait ends with the job's status, and the job ran on a thread other than the waiter's."""
    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=5), {"max_concurrent_runs": 2,
                                                                       "callback_order": "completion"}) as r:
        ins, outs = cpu_io(r, 2.0)
        seen, done = {}, threading.Event()

        def inner_ended(_handle):
            seen["inner_thread"] = threading.current_thread().name

        def outer_ended(_handle):
            seen["waiter"] = threading.current_thread().name
            job = r.execute_async(ins, outs, callback=inner_ended)
            if how == "wait":
                seen["status"] = r.wait(job, 20_000)
            else:
                seen["status"] = r.wait_any([job], 20_000).status
            done.set()

        assert r.execute_async(ins, outs, callback=outer_ended).status is StatusCode.SUCCESS
        assert done.wait(30)
        assert seen["status"] is StatusCode.SUCCESS
        assert seen["inner_thread"] != seen["waiter"]
        np.testing.assert_array_equal(outs[0][0].numpy(), np.full(outs[0][0].info.shape, 2.0 * 2.0 + 1.0))


@pytest.mark.parametrize("queued_before", [False, True], ids=["continuation", "queued_behind"])
def test_close_in_a_callback_ends_what_only_its_worker_could_run(axpy_model, queued_before):
    """close() in a callback on a worker: the job that callback submitted (the worker's continuation), or a job
    queued behind the callback's job on the runner's only worker, ends with FAILURE, unrun, and close() returns (it
    waited for them: a hang)."""
    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=20), {"max_concurrent_runs": 2,
                                                                        "async_threadpool_depth": 1,
                                                                        "callback_order": "completion"}) as r:
        ins, outs = cpu_io(r, 1.0)
        ins2, outs2 = cpu_io(r, 2.0)
        seen, closed = [], threading.Event()

        def ended(handle):
            seen.append(handle.status)

        def first(handle):
            seen.append(handle.status)
            if not queued_before:
                assert r.execute_async(ins2, outs2, callback=ended).status is StatusCode.SUCCESS
            r.close()
            closed.set()

        assert r.execute_async(ins, outs, callback=first).status is StatusCode.SUCCESS
        if queued_before:  # behind the first job, on the one worker
            assert r.execute_async(ins2, outs2, callback=ended).status is StatusCode.SUCCESS
        assert closed.wait(10), "close() in the callback hung"
        assert seen == [StatusCode.SUCCESS, StatusCode.FAILURE]
        assert np.all(outs2[0][0].numpy() == 0.0)  # never ran


def test_an_evicted_engine_is_closed_once_nothing_uses_it(axpy_model):
    import gc

    with RunnerFactory.create_runner("AXPY", axpy_model(shape=[1, 3, None, 4], dynamic=False),
                                     {"max_compiled_shapes": 1}) as r:
        r.run({"x": np.ones((1, 3, 2, 4), np.float32)})
        first = r.engine_for([(1, 3, 2, 4)])
        r.run({"x": np.ones((1, 3, 3, 4), np.float32)})  # the LRU holds one: the first engine goes
        gc.collect()
        assert first.closed
        with pytest.raises(ValueError, match=r"no engine is compiled for input shapes \[\[1, 3, 2, 4\]\]"):
            r.engine_for([(1, 3, 2, 4)])


def test_log_level_is_the_runners_not_the_process(axpy_model):
    import logging

    logger = logging.getLogger("npurt")
    before = logger.level
    with RunnerFactory.create_runner("AXPY", axpy_model(), {"log_level": "DEBUG"}) as r:
        assert logger.level == before  # the application's logging configuration stays as it was
        assert r.log.level == logging.DEBUG

