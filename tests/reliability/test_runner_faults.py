"""Fault handling of the Runner contract itself, on the numpy test backend (and, for the exit, on the real engines)."""

import _thread
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from npurt import NpuTensor, RunnerFactory, StatusCode, TensorType
from tests.helpers.procstat import open_fds, pool_workers, rss_bytes, threads

CPU = {"input_tensor_type": "CPU", "output_tensor_type": "CPU"}


def io(runner, value=1.0):
    x = runner.get_tensor_info_by_name("x", TensorType.CPU)
    y = runner.get_tensor_info_by_name("y", TensorType.CPU)
    return ([[NpuTensor(x, np.full(x.shape, value, np.float32))]],
            [[NpuTensor(y, np.zeros(y.shape, np.float32))]])


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler, for the test: a suite started with SIGINT ignored (a background job, nohup)
    inherits SIG_IGN, and then _thread.interrupt_main() does nothing (it simulates a signal Python handles)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_keyboard_interrupt_reaches_a_waiting_main_thread(axpy_model, sigint_raises):
    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=1500), CPU) as r:
        ins, outs = io(r)
        job = r.execute_async(ins, outs)
        timer = threading.Timer(0.2, _thread.interrupt_main)
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            r.wait(job)  # no timeout: would wait 1.5 s
        assert time.monotonic() - t0 < 1.0
        # the job is still there and finishes normally
        assert r.wait(job, 5000) is StatusCode.SUCCESS


def test_close_while_jobs_in_flight_ends_every_job(axpy_model):
    r = RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=100), {**CPU, "max_concurrent_runs": 8,
                                                                       "async_threadpool_depth": 2})
    ins, outs = io(r)
    seen = []
    jobs = [r.execute_async(ins, outs, seen.append) for _ in range(8)]
    assert all(j.status is StatusCode.SUCCESS for j in jobs)
    t0 = time.monotonic()
    r.close()
    assert time.monotonic() - t0 < 5
    # every callback ran exactly once, with a final status; none is left pending
    assert sorted(h.job_id for h in seen) == [j.job_id for j in jobs]
    assert {h.status for h in seen} <= {StatusCode.SUCCESS, StatusCode.FAILURE}
    assert StatusCode.JOB_PENDING not in {h.status for h in seen}


def test_callback_that_submits_and_waits_does_not_deadlock(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(), {**CPU, "max_concurrent_runs": 2}) as r:
        ins, outs = io(r)
        inner = []
        done = threading.Event()

        def callback(handle):
            job = r.execute_async(ins, outs)
            inner.append(r.wait(job, 5000))
            done.set()

        r.execute_async(ins, outs, callback)
        assert done.wait(10)
        assert inner == [StatusCode.SUCCESS]


def test_runner_cycles_leak_nothing(axpy_model):
    """10,000 execute / execute_async / wait cycles: fds, threads and RSS stay where they were."""
    with RunnerFactory.create_runner("AXPY", axpy_model(), CPU) as r:
        ins, outs = io(r)
        for _ in range(200):  # warm up: thread pool, staging, plan cache
            r.execute(ins, outs)
            r.wait(r.execute_async(ins, outs), 5000)
        fds, nthreads, rss = open_fds(), threads(), rss_bytes()
        for _ in range(10_000):
            assert r.execute(ins, outs) is StatusCode.SUCCESS
            job = r.execute_async(ins, outs)
            assert r.wait(job, 5000) is StatusCode.SUCCESS
        assert open_fds() == fds
        assert threads() == nthreads
        assert pool_workers() <= r.max_concurrent_runs  # the pool is bounded, not leaking
        assert rss_bytes() - rss < 4 << 20  # 4 MiB margin for allocator noise
        assert len(r._core.jobs) == 0  # every collected job is forgotten


@pytest.mark.parametrize("engine_async", [False, True], ids=["workers", "engine_async"])
def test_exit_with_a_runner_left_open_waits_for_its_jobs(axpy_model, engine_async):
    """A program that exits with jobs in flight and its runner never closed: the jobs end (their outputs are
    written), nothing hangs, nothing crashes."""
    model = axpy_model(delay_ms=300, engine_async=engine_async)
    out = model.with_suffix(".npy")
    root = Path(__file__).resolve().parents[2]  # the repository: `tests` imports from there
    program = f"""
import numpy as np
from tests.helpers.axpy_backend import AxpyBackend
from npurt import NpuTensor, RunnerFactory, TensorType
RunnerFactory.register_backend("AXPY", AxpyBackend)
r = RunnerFactory.create_runner("AXPY", {str(model)!r}, {{"input_tensor_type": "CPU", "output_tensor_type": "CPU"}})
x = NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU), np.ones((1, 3, 4, 4), np.float32))
y = np.lib.format.open_memmap({str(out)!r}, mode="w+", dtype=np.float32, shape=(1, 3, 4, 4))
job = r.execute_async([[x]], [[NpuTensor(r.get_tensor_info_by_name("y", TensorType.CPU), y)]])
assert job.status.name == "SUCCESS"
"""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 < 30
    assert np.all(np.load(out) == 3.0)  # the job ran to its end before the process exited


@pytest.mark.parametrize("call", ["execute", "execute_async"])
def test_an_engine_failing_unexpectedly_is_a_status_not_an_exception(axpy_model, call):
    """execute and execute_async never raise: an engine's unexpected error while binding is FAILURE with the
    error in last_error, and the runner goes on."""
    with RunnerFactory.create_runner("AXPY", axpy_model(bind_raises=True), CPU) as r:
        ins, outs = io(r)
        result = getattr(r, call)(ins, outs)
        status = result if call == "execute" else result.status
        assert status is StatusCode.FAILURE
        assert "bind failed" in r.last_error


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_exit_while_daemon_threads_are_inside_the_engine(backend):
    """A program whose daemon threads are inside `execute` on a real engine when its main thread returns: npurt
    closes the runner and lets the runs leave the engine before the interpreter finalizes (a thread still in the
    engine's C++ then is unwound through it and the process aborts, rc 134: as with the raw engines)."""
    root = Path(__file__).resolve().parents[2]
    program = f"""
import threading, time
from npurt import RunnerFactory, TensorDirection, TensorType
from tests.helpers.models import model_or_skip
r = RunnerFactory.create_runner({backend!r}, model_or_skip("ocr_rec"), {{"shapes": {{"x": [1, 3, 48, 320]}},
                                                                        "device": "CPU"}})
x = r.allocate_npu_tensor(r.get_tensor_info_by_name("x", TensorType.CPU))
y = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0])
runs = [0, 0]
def loop(i):
    while r.execute([[x]], [[y]]).name == "SUCCESS":
        runs[i] += 1
for i in range(2):
    threading.Thread(target=loop, args=(i,), daemon=True).start()
while min(runs) < 2:
    time.sleep(0.01)
print("runs", runs)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("runs")


def test_exit_closes_a_runner_made_while_it_waits():
    """The main thread returns while a daemon thread is still loading a model (inside the engine), which it then
    runs in a loop: the exit closes that runner too once it is made, and the process ends cleanly."""
    root = Path(__file__).resolve().parents[2]
    program = """
import threading, time
from npurt import RunnerFactory, TensorDirection, TensorType
from tests.helpers.models import model_or_skip
model = model_or_skip("ocr_rec")
def app():
    r = RunnerFactory.create_runner("VAIML", model, {"shapes": {"x": [1, 3, 48, 320]}, "device": "CPU"})
    x = r.allocate_npu_tensor(r.get_tensor_info_by_name("x", TensorType.CPU))
    y = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0])
    while r.execute([[x]], [[y]]).name == "SUCCESS":
        pass
threading.Thread(target=app, daemon=True).start()
time.sleep(0.05)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "inside an engine call" not in done.stderr


def test_threads_inside_a_registered_backends_engine_are_seen(axpy_model):
    """The exit's wait finds threads inside an engine of a backend registered from outside npurt (AXPY, the test
    backend) by its methods' frames, as it finds npurt's own backends by their package."""
    from npurt.shutdown import threads_in_engines

    with RunnerFactory.create_runner("AXPY", axpy_model(delay_ms=400), CPU) as r:
        ins, outs = io(r)
        worker = threading.Thread(target=r.execute, args=(ins, outs), name="app-run")
        worker.start()
        time.sleep(0.1)
        inside = threads_in_engines()
        worker.join()
        assert "app-run" in inside
        assert "app-run" not in threads_in_engines()
