"""Long runs leave open fds, threads and RSS where they started (margins stated per test)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from npurt import MemoryType, NpuTensor, RunnerFactory, RunnerType, StatusCode, TensorDirection, TensorType
from tests.helpers.models import model_or_skip
from tests.helpers.procstat import open_fds, pool_workers, rss_bytes, threads

CYCLES = 10_000
RSS_MARGIN = 16 << 20  # native allocator and engine arenas settle within this after warm-up (seen: 1-2 MiB)


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
