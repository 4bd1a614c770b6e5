"""Long runs leave open fds, threads and RSS where they started (margins stated per test)."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest

from npurt import MemoryType, NpuTensor, RunnerFactory, RunnerType, StatusCode, TensorDirection, TensorType
from tests.helpers.models import model_or_skip
from tests.helpers.procstat import open_fds, pool_workers, rss_bytes, threads

# 4000 cycles under 8 MiB: a leak of 2 KiB a cycle fails (10,000 under 16 MiB took 25-50 s of the suite a backend
# for 1.6 KiB); fds and threads fail at any count
CYCLES = 4_000
RSS_MARGIN = 8 << 20  # native allocator and engine arenas settle within this after warm-up (seen: 1-2 MiB)


@pytest.mark.parametrize("backend", [RunnerType.OPENVINO, RunnerType.VAIML], ids=lambda t: t.name)
def test_execute_async_wait_cycles(backend):
    with RunnerFactory.create_runner(backend, model_or_skip("ocr_cls"),
                                     {"shapes": {"x": [1, 3, 48, 192]}, "device": "CPU"}) as r:
        x = r.allocate_npu_tensor(r.get_tensor_info_by_name("x"))  # HW views: the zero-copy path
        y = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT)[0].replace(shape=(1, 2)))
        x.numpy()[...] = np.random.default_rng(1).standard_normal(x.info.shape).astype(x.numpy().dtype)
        for _ in range(1000):
            r.execute([[x]], [[y]])
            r.wait(r.execute_async([[x]], [[y]]), 10_000)
        gc.collect()
        fds, nthreads, rss = open_fds(), threads(), rss_bytes()
        for _ in range(CYCLES):
            assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
            assert r.wait(r.execute_async([[x]], [[y]]), 10_000) is StatusCode.SUCCESS
        gc.collect()
        assert open_fds() == fds
        assert threads() == nthreads
        assert pool_workers() <= r.max_concurrent_runs  # the pool is bounded, not leaking
        assert rss_bytes() - rss < RSS_MARGIN, f"RSS grew by {(rss_bytes() - rss) >> 10} KiB"
        assert r.stats["copies"] == 0


def test_allocate_export_import_close_cycles():
    with RunnerFactory.create_runner(RunnerType.OPENVINO, model_or_skip("ocr_cls"),
                                     {"shapes": {"x": [1, 3, 48, 192]}, "device": "CPU"}) as r:
        info = r.get_tensor_info_by_name("x", TensorType.CPU)

        def cycle(i: int) -> None:
            t = r.allocate_npu_tensor(info)
            fd = t.export_buffer()
            try:
                peer = NpuTensor(info, fd, MemoryType.DMA_FD)
            finally:
                os.close(fd)
            peer.numpy()[0, 0, 0, 0] = i
            assert t.numpy()[0, 0, 0, 0] == i

        for i in range(200):
            cycle(i)
        gc.collect()
        fds, rss = open_fds(), rss_bytes()
        for i in range(CYCLES):
            cycle(i)
        gc.collect()
        assert open_fds() == fds
        assert rss_bytes() - rss < RSS_MARGIN, f"RSS grew by {(rss_bytes() - rss) >> 10} KiB"


@pytest.mark.parametrize("order", ["completion", "submission"])
@pytest.mark.parametrize("backend", [RunnerType.OPENVINO, RunnerType.VAIML], ids=lambda t: t.name)
def test_dropped_runner_lets_its_threads_and_engines_go(backend, order):
    """A runner the app drops unclosed, after jobs with callbacks (worker and callback threads started), is freed
    with its engines as its last reference goes (no reference cycle: the garbage collector is off here), its
    threads end, and every callback was delivered first; the app's tensors keep none of it alive."""
    before = set(threading.enumerate())
    r = RunnerFactory.create_runner(backend, model_or_skip("ocr_cls"),
                                    {"shapes": {"x": [1, 3, 48, 192]}, "device": "CPU", "max_concurrent_runs": 2,
                                     "callback_order": order})
    x = r.allocate_npu_tensor(r.get_tensor_info_by_name("x", TensorType.CPU))
    y = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0])
    delivered: list[StatusCode] = []
    for i in range(3):  # (a job with a callback leaves the table once its callback returned: no wait for it)
        jobs = [r.execute_async([[x]], [[y]], callback=lambda h: delivered.append(h.status)) for _ in range(2)]
        assert [j.status for j in jobs] == [StatusCode.SUCCESS] * 2
        deadline = time.monotonic() + 10
        while len(delivered) < 2 * (i + 1) and time.monotonic() < deadline:
            time.sleep(0.001)
    started = [t for t in threading.enumerate() if t not in before and t.name.startswith("npurt-")]
    assert started, "the jobs started no thread of the runner's: nothing tested"
    engines = [weakref.ref(v.engine) for v in r._core.variants.compiled()]
    assert engines
    jobs = [r.execute_async([[x]], [[y]], callback=lambda h: delivered.append(h.status))]  # in flight when dropped
    gc.disable()
    try:
        del r, jobs
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (any(t.is_alive() for t in started) or any(e() for e in engines)):
            for t in started:  # (the job in flight and its callback hold the runner's parts until they end)
                t.join(0.05)
    finally:
        gc.enable()
    assert [t.name for t in started if t.is_alive()] == []
    assert [e() for e in engines] == [None] * len(engines)
    assert delivered == [StatusCode.SUCCESS] * 7
    assert np.isfinite(y.numpy()).all()
