"""8 threads x 500 execute plus 500 execute_async on one shared runner per backend: results identical to
sequential ones, no deadlock (every wait is bounded), callbacks in the promised order."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from npurt import NpuTensor, RunnerFactory, RunnerType, StatusCode, TensorDirection, TensorType
from tests.helpers.models import model_or_skip

THREADS = 8
ITERATIONS = 500
SHAPE = (1, 3, 48, 192)


@pytest.fixture(scope="module", params=[RunnerType.OPENVINO, RunnerType.VAIML], ids=lambda t: t.name)
def runner(request):
    r = RunnerFactory.create_runner(request.param, model_or_skip("ocr_cls"),
                                    {"shapes": {"x": list(SHAPE)}, "device": "CPU", "max_concurrent_runs": 4})
    yield r
    r.close()


def frames(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]


def test_threads_agree_with_sequential_runs(runner):
    x_cpu = runner.get_tensor_info_by_name("x", TensorType.CPU)
    # the classifier's output is [N, 2]; ONNX Runtime leaves N open until a run (its graph computes it)
    y_cpu = runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0].replace(shape=(1, 2))
    inputs = frames(THREADS)
    expected = []
    for arr in inputs:  # sequential reference, through the same runner and views
        y = NpuTensor(y_cpu, np.zeros(y_cpu.shape, np.float32))
        assert runner.execute([[NpuTensor(x_cpu, arr)]], [[y]]) is StatusCode.SUCCESS
        expected.append(y.numpy().copy())

    errors: list[str] = []
    retries = [0] * THREADS

    def work(k: int) -> None:
        x = NpuTensor(x_cpu, inputs[k])
        y = NpuTensor(y_cpu, np.zeros(y_cpu.shape, np.float32))
        for i in range(ITERATIONS):
            y.numpy()[...] = np.nan
            status = runner.execute([[x]], [[y]])
            if status is not StatusCode.SUCCESS or not np.array_equal(y.numpy(), expected[k]):
                errors.append(f"thread {k} execute {i}: {status.name} {runner.last_error}")
                return
            y.numpy()[...] = np.nan
            deadline = time.monotonic() + 30
            while (job := runner.execute_async([[x]], [[y]])).status is StatusCode.RESOURCE_UNAVAILABLE:
                retries[k] += 1  # transient: every run slot is busy
                if time.monotonic() > deadline:
                    errors.append(f"thread {k}: no free run slot for 30 s")
                    return
                time.sleep(0.0005)
            status = runner.wait(job, 30_000)
            if status is not StatusCode.SUCCESS or not np.array_equal(y.numpy(), expected[k]):
                errors.append(f"thread {k} async {i}: {status.name} {runner.last_error}")
                return

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread did not finish in 240 s"
    assert errors == []
    stats = runner.stats
    assert stats["jobs_failed"] == 0 and stats["execute_failures"] == 0


@pytest.mark.parametrize("order", ["submission", "completion"])
def test_callbacks_in_the_promised_order(order):
    r = RunnerFactory.create_runner(RunnerType.OPENVINO, model_or_skip("ocr_cls"),
                                    {"shapes": {"x": list(SHAPE)}, "device": "CPU", "max_concurrent_runs": 4,
                                     "callback_order": order, "output_tensor_type": "CPU"})
    try:
        x_cpu = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_cpu = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        delivered: list[int] = []
        finished: dict[int, float] = {}
        done = threading.Event()
        total = 200

        def callback(handle):
            finished[handle.job_id] = time.monotonic()
            delivered.append(handle.job_id)
            assert handle.status is StatusCode.SUCCESS
            if len(delivered) == total:
                done.set()

        submitted = []
        x = NpuTensor(x_cpu, frames(1)[0])
        while len(submitted) < total:
            y = NpuTensor(y_cpu, np.zeros(y_cpu.shape, np.float32))
            job = r.execute_async([[x]], [[y]], callback)
            if job.status is StatusCode.SUCCESS:
                submitted.append(job.job_id)
            else:
                assert job.status is StatusCode.RESOURCE_UNAVAILABLE
                time.sleep(0.0002)
        assert done.wait(60)
        assert sorted(delivered) == submitted  # each callback exactly once
        if order == "submission":
            assert delivered == submitted
    finally:
        r.close()
