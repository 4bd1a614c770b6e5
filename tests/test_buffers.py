"""The native memory layer: npurt._native.Buffer (allocation chain, fd import checks, sync, export) and the
NpuTensor memory types built on it (XRT_BO, DMA_FD), on the real kernel interfaces of this machine."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from npurt import (
    DataType,
    MemoryType,
    NpuError,
    NpuTensor,
    NpuTensorInfo,
    RunnerFactory,
    TensorDirection,
    TensorType,
    _native,
)
from npurt.tensor import PAGE_SIZE, allocate_tensor, import_dma_fd, sub_tensor
from tests.helpers.procstat import open_fds, rss_bytes, settled_fds

Buffer = _native.Buffer
HEAP = Path("/dev/dma_heap/system")
UDMABUF = Path("/dev/udmabuf")
needs_heap = pytest.mark.skipif(not HEAP.exists(), reason="no /dev/dma_heap/system on this machine (no DMA-BUF heap)")
needs_udmabuf = pytest.mark.skipif(not UDMABUF.exists(), reason="no /dev/udmabuf on this machine (udmabuf not loaded)")
SEALED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def cpu_info(shape=(1, 3, 4, 4), dtype=DataType.FLOAT32, direction=TensorDirection.INPUT, name="x"):
    return NpuTensorInfo(name=name, data_type=dtype, shape=shape, direction=direction, tensor_type=TensorType.CPU)


def memfd(size: int, seals: int = 0) -> int:
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


# ---------------------------------------------------------------------------------------------- allocation
def test_auto_takes_the_strongest_provider_present_and_says_why_it_skipped_others():
    buf = Buffer.allocate(10_000)
    expected = "dma_heap:system" if HEAP.exists() else "udmabuf" if UDMABUF.exists() else "memfd"
    if buf.provider != expected:  # a node can exist and still refuse us (permissions): the reasons say so
        assert any(r.startswith(expected) for r in buf.fallback_reasons), buf.fallback_reasons
    if not HEAP.exists():
        assert any("/dev/dma_heap/system" in r for r in buf.fallback_reasons)
    assert buf.size == len(buf) == 10_000
    assert buf.address % PAGE_SIZE == 0
    assert buf.fd >= 0 and not buf.readonly


def test_memfd_is_sealed_and_exports_the_same_memory():
    buf = Buffer.allocate(5000, "memfd")
    assert buf.provider == "memfd" and not buf.is_dmabuf and buf.fallback_reasons == []
    assert fcntl.fcntl(buf.fd, fcntl.F_GET_SEALS) == SEALED
    assert os.fstat(buf.fd).st_size == 2 * PAGE_SIZE  # whole pages
    assert os.readlink(f"/proc/self/fd/{buf.fd}").startswith("/memfd:npurt")
    fd = buf.export()
    try:
        assert fd != buf.fd and fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        np.frombuffer(buf, np.uint8)[:] = 0x5A
        assert os.pread(fd, 4, 4996) == b"\x5a" * 4
    finally:
        os.close(fd)


def test_host_memory_is_page_aligned_and_not_exportable():
    buf = Buffer.allocate(3, "host")
    assert (buf.provider, buf.fd, buf.export(), buf.is_dmabuf) == ("host", -1, -1, False)
    assert buf.address % PAGE_SIZE == 0
    buf.sync_start(True, True)  # no-op
    buf.sync_end(True, True)


def vm_flags(address: int) -> list[str]:
    """The kernel's flags of the mapping that holds ``address`` (/proc/self/smaps' VmFlags)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").exists(),
                    reason="this kernel has no transparent huge pages (the advice is refused, and ignored)")
@pytest.mark.parametrize("provider", ["host", "memfd"])
def test_buffers_of_a_huge_page_or_more_ask_for_huge_pages(provider):
    # (MADV_HUGEPAGE: the mapping's "hg" flag; whether the kernel then gives huge pages is its THP setting's call)
    large, small = Buffer.allocate(4 << 20, provider), Buffer.allocate(1 << 20, provider)
    assert "hg" in vm_flags(large.address)
    assert "hg" not in vm_flags(small.address)


def test_buffer_protocol_gives_writable_zero_copy_views():
    buf = Buffer.allocate(64, "memfd")
    view = memoryview(buf)
    assert (view.nbytes, view.format, view.readonly) == (64, "B", False)
    arr = np.frombuffer(buf, np.float32)
    assert arr.ctypes.data == buf.address and arr.flags.writeable
    arr[:] = 1.5
    assert np.frombuffer(view, np.float32).tolist() == [1.5] * 16
    del buf  # the views keep the mapping alive
    assert arr.sum() == 24.0


def test_address_of_gives_the_first_byte_of_any_contiguous_buffer():
    buf = Buffer.allocate(64, "memfd")
    arr = np.arange(16, dtype=np.float32)
    frozen = arr.copy()
    frozen.flags.writeable = False
    for buffer, address in ((buf, buf.address), (arr, arr.ctypes.data), (arr[3:], arr.ctypes.data + 12),
                            (frozen, frozen.ctypes.data), (memoryview(buf)[8:], buf.address + 8)):
        assert _native.address_of(buffer) == address
    with pytest.raises(TypeError):
        _native.address_of(3)
    with pytest.raises(ValueError, match="contiguous"):  # (a tensor's bytes never are: NpuTensor refuses them)
        _native.address_of(arr[::2])


def test_strict_auto_refuses_to_fall_below_the_heap():
    if HEAP.exists():
        pytest.skip("/dev/dma_heap/system is present: strict auto succeeds here")
    with pytest.raises(OSError, match="dma_heap:system.*No such file") as e:
        Buffer.allocate(4096, "auto", strict=True)
    assert e.value.errno == errno.ENOENT


def test_explicit_providers_give_exactly_that_or_raise():
    for provider, node in (("dma_heap", HEAP), ("udmabuf", UDMABUF)):
        if node.exists():
            continue
        with pytest.raises(OSError, match=f"{node}"):
            Buffer.allocate(4096, provider)
    if not Path("/dev/dma_heap/nope").exists():
        with pytest.raises(OSError, match="/dev/dma_heap/nope"):
            Buffer.allocate(4096, "dma_heap:nope")


@pytest.mark.parametrize("args, match", [
    ((4096, "gpu"), "'gpu' is not one of"),
    ((-1,), "negative"),
    ((4096, "dma_heap:../../dev/zero"), "not a name under /dev/dma_heap"),
    ((4096, "dma_heap", False, ""), "not a name"),
])
def test_bad_allocation_arguments_raise_value_error(args, match):
    with pytest.raises(ValueError, match=match):
        Buffer.allocate(*args)


def test_impossible_allocation_raises_os_error():
    with pytest.raises(OSError) as e:
        Buffer.allocate(1 << 60, "host")
    assert e.value.errno == errno.ENOMEM


@needs_heap
def test_dma_heap_buffer_is_a_dmabuf_with_working_sync():
    buf = Buffer.allocate(1 << 20, "dma_heap")
    assert buf.provider == "dma_heap:system" and buf.is_dmabuf
    buf.sync_start(read=False, write=True)
    np.frombuffer(buf, np.uint8)[:] = 7
    buf.sync_end(read=False, write=True)
    fd = buf.export()
    try:
        other = Buffer.import_fd(fd, 1 << 20)
        assert other.is_dmabuf and other.provider == "dma_heap:system"
        assert np.frombuffer(other, np.uint8)[-1] == 7
    finally:
        os.close(fd)


@needs_udmabuf
def test_udmabuf_buffer_is_a_dmabuf_with_working_sync():
    buf = Buffer.allocate(1 << 20, "udmabuf")
    assert buf.provider == "udmabuf" and buf.is_dmabuf
    buf.sync_start()
    np.frombuffer(buf, np.uint8)[:] = 9
    buf.sync_end()
    fd = buf.export()
    try:
        other = Buffer.import_fd(fd, 1 << 20)
        assert other.is_dmabuf and other.provider == "udmabuf"
        assert np.frombuffer(other, np.uint8)[0] == 9
    finally:
        os.close(fd)


def test_sync_needs_a_direction():
    with pytest.raises(ValueError, match="read=True, write=True"):
        Buffer.allocate(1, "memfd").sync_start(read=False, write=False)


# ---------------------------------------------------------------------------------------------- import
def test_import_maps_a_sealed_memfd_without_taking_the_callers_fd():
    fd = memfd(3 * PAGE_SIZE, fcntl.F_SEAL_SHRINK)
    os.pwrite(fd, b"abcd", PAGE_SIZE)
    buf = Buffer.import_fd(fd, PAGE_SIZE, PAGE_SIZE)
    assert (buf.provider, buf.size, buf.offset) == ("memfd", PAGE_SIZE, PAGE_SIZE)
    assert bytes(memoryview(buf)[:4]) == b"abcd"
    assert buf.fd != fd
    os.close(fd)  # ours to close; the buffer has its own duplicate
    memoryview(buf)[4:8] = b"efgh"
    assert bytes(memoryview(buf)[:8]) == b"abcdefgh"
    buf.sync_start()  # no-op for a memfd
    buf.sync_end()


def test_write_sealed_memfd_maps_read_only():
    fd = memfd(PAGE_SIZE, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    try:
        buf = Buffer.import_fd(fd, PAGE_SIZE)
        assert buf.readonly and memoryview(buf).readonly
        assert not np.frombuffer(buf, np.uint8).flags.writeable
    finally:
        os.close(fd)


def test_read_only_fd_maps_read_only(tmp_path):
    path = tmp_path / "frame.bin"
    path.write_bytes(b"\1" * PAGE_SIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = Buffer.import_fd(fd, PAGE_SIZE)
        assert buf.provider == "file" and buf.readonly
        assert np.frombuffer(buf, np.uint8).sum() == PAGE_SIZE
        with pytest.raises(ValueError, match="regular file.*truncate"):
            Buffer.import_fd(fd, PAGE_SIZE, allow_file=False)
    finally:
        os.close(fd)
    wfd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(ValueError, match="write-only"):
            Buffer.import_fd(wfd, PAGE_SIZE)
    finally:
        os.close(wfd)


def test_unsealed_memfd_is_refused_before_mapping():
    fd = memfd(PAGE_SIZE)
    try:
        with pytest.raises(ValueError, match=f"fd {fd} is a memfd without F_SEAL_SHRINK.*SIGBUS"):
            Buffer.import_fd(fd, PAGE_SIZE)
    finally:
        os.close(fd)


@pytest.mark.parametrize("size, offset, match", [
    (2 * PAGE_SIZE, 0, rf"holds {PAGE_SIZE} bytes; asked for {2 * PAGE_SIZE} bytes at offset 0"),
    (1, 2 * PAGE_SIZE, rf"holds {PAGE_SIZE} bytes; asked for 1 bytes at offset {2 * PAGE_SIZE}"),
    (PAGE_SIZE, PAGE_SIZE, "holds"),
    (16, 64, "offset 64 is not a multiple of the page size"),
    (0, 0, "nothing to map"),
])
def test_import_checks_size_and_offset(size, offset, match):
    fd = memfd(PAGE_SIZE, SEALED)
    try:
        with pytest.raises(ValueError, match=match):
            Buffer.import_fd(fd, size, offset)
    finally:
        os.close(fd)


def test_import_refuses_what_is_not_memory(tmp_path):
    r, w = os.pipe()
    a, b = socket.socketpair()
    dev_null = os.open("/dev/null", os.O_RDWR)
    directory = os.open(tmp_path, os.O_RDONLY)
    event = os.eventfd(0)
    try:
        for fd, what in ((r, "a pipe"), (w, "a pipe"), (a.fileno(), "a socket"), (dev_null, "a character device"),
                         (directory, "a directory"), (event, "an anonymous inode")):
            with pytest.raises(ValueError, match=f"fd {fd} is {what}.*not memory"):
                Buffer.import_fd(fd, 16)
    finally:
        for fd in (r, w, dev_null, directory, event):
            os.close(fd)
        a.close()
        b.close()


def test_import_of_a_closed_or_negative_fd():
    fd = memfd(PAGE_SIZE, SEALED)
    os.close(fd)
    with pytest.raises(OSError, match=f"fd {fd} is not open") as e:
        Buffer.import_fd(fd, 16)
    assert e.value.errno == errno.EBADF
    with pytest.raises(ValueError, match="fd -1 is not a file descriptor"):
        Buffer.import_fd(-1, 16)


def test_buffers_close_their_fds_and_mappings():
    before = open_fds()
    bufs = [Buffer.allocate(PAGE_SIZE, "memfd") for _ in range(20)]
    fd = bufs[0].export()
    imported = [Buffer.import_fd(fd, PAGE_SIZE) for _ in range(20)]
    os.close(fd)
    assert open_fds() == before + 40
    del bufs, imported
    assert open_fds() == before


def test_ten_thousand_export_import_cycles_leave_fds_and_rss_alone():
    # Margin: RSS may move by up to 8 MiB (allocator and interpreter noise); one leaked mapping per cycle
    # of this 64 KiB tensor (touched every cycle) would grow it by 625 MiB, a leaked fd shows at once.
    info = cpu_info(shape=(16384,))
    src = allocate_tensor(info, provider="memfd")
    src.numpy()[...] = 3.0

    def cycle(n: int) -> None:
        for i in range(n):
            fd = src.export_buffer()
            t = NpuTensor(info, fd, MemoryType.DMA_FD)
            os.close(fd)
            view = t.numpy()
            view[i % 16384] += 1.0
            assert view[0] >= 3.0
            del t, view

    cycle(200)  # warm-up: first-touch pages, interpreter caches
    fds, rss = open_fds(), rss_bytes()
    cycle(10_000)
    assert open_fds() == fds
    assert rss_bytes() - rss < 8 << 20
    assert float(src.numpy().sum()) == 16384 * 3.0 + 10_200


# ---------------------------------------------------------------------------------------------- NpuTensor
def test_allocate_tensor_follows_the_provider_option():
    info = cpu_info()
    t = allocate_tensor(info, provider="memfd")
    assert t.provider == "memfd" and t.memory_type is MemoryType.XRT_BO
    assert isinstance(t.get_buffer(), Buffer)
    assert t.get_virtual_address() % PAGE_SIZE == 0
    host = allocate_tensor(info, provider="host")
    assert host.provider == "host" and host.export_buffer() == -1
    if not HEAP.exists():
        with pytest.raises(NpuError, match=r"'x'.*dma_heap:system"):
            allocate_tensor(info, provider="auto", strict=True)
        with pytest.raises(NpuError, match=r"'x'.*dma_heap"):
            allocate_tensor(info, provider="dma_heap")
    with pytest.raises(ValueError, match="'x'.*'gpu'"):
        allocate_tensor(info, provider="gpu")


def test_allocated_dma_fd_tensor_gives_its_fd():
    t = allocate_tensor(cpu_info(), MemoryType.DMA_FD)
    assert t.memory_type is MemoryType.DMA_FD
    fd = t.get_buffer()
    assert isinstance(fd, int) and os.fstat(fd).st_size >= t.nbytes
    with pytest.raises(ValueError, match="fd-backed"):
        allocate_tensor(cpu_info(), MemoryType.DMA_FD, provider="host")


def test_dma_fd_tensor_maps_the_fd_at_an_offset_and_exports_it():
    src = allocate_tensor(cpu_info(shape=(3 * PAGE_SIZE,), dtype=DataType.UINT8), provider="memfd")
    src.numpy()[:] = np.arange(3 * PAGE_SIZE) % 251
    fd = src.export_buffer()
    try:
        info = cpu_info(shape=(8,), dtype=DataType.UINT8, direction=TensorDirection.OUTPUT)
        for offset in (0, PAGE_SIZE, PAGE_SIZE + 40, 2 * PAGE_SIZE + 8):
            t = NpuTensor(info, fd, MemoryType.DMA_FD, offset=offset)
            assert t.get_buffer() == fd and t.provider == "memfd" and t.offset == offset
            assert t.numpy().tolist() == [(offset + i) % 251 for i in range(8)]
            t.numpy()[0] = 255
            assert src.numpy()[offset] == 255
            t.sync_buffer()
            t.begin_cpu_access(write=True)
            t.end_cpu_access(write=True)
            again = t.export_buffer()
            try:
                assert NpuTensor(info, again, MemoryType.DMA_FD, offset=t.offset).numpy()[0] == 255
            finally:
                os.close(again)
    finally:
        os.close(fd)


def test_dma_fd_tensor_errors_name_the_tensor():
    fd = memfd(PAGE_SIZE, SEALED)
    unsealed = memfd(PAGE_SIZE)
    try:
        with pytest.raises(ValueError, match=r"'x'.*not aligned to its 4-byte FLOAT32"):
            NpuTensor(cpu_info(shape=(4,)), fd, MemoryType.DMA_FD, offset=2)
        with pytest.raises(ValueError, match=r"'x'.*holds 4096 bytes"):
            NpuTensor(cpu_info(shape=(PAGE_SIZE,)), fd, MemoryType.DMA_FD)
        with pytest.raises(ValueError, match=r"'x'.*F_SEAL_SHRINK"):
            NpuTensor(cpu_info(), unsealed, MemoryType.DMA_FD)
        with pytest.raises(ValueError, match=r"'x'.*an fd \(int\)"):
            NpuTensor(cpu_info(), True, MemoryType.DMA_FD)
        with pytest.raises(ValueError, match=r"'x'.*regular file|'x'.*F_SEAL"):
            import_dma_fd(cpu_info(), unsealed, allow_file=False)
    finally:
        os.close(fd)
        os.close(unsealed)
    with pytest.raises(OSError, match=r"'x'.*not open"):
        NpuTensor(cpu_info(), fd, MemoryType.DMA_FD)


def test_output_tensor_over_read_only_memory_is_refused():
    fd = memfd(PAGE_SIZE, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    try:
        with pytest.raises(ValueError, match="read-only"):
            NpuTensor(cpu_info(direction=TensorDirection.OUTPUT), fd, MemoryType.DMA_FD)
        assert not NpuTensor(cpu_info(), fd, MemoryType.DMA_FD).writable
    finally:
        os.close(fd)


def test_xrt_bo_tensor_over_a_native_buffer():
    buf = Buffer.allocate(2 * PAGE_SIZE, "memfd")
    t = NpuTensor(cpu_info(), buf, MemoryType.XRT_BO, offset=PAGE_SIZE)
    assert t.get_virtual_address() == buf.address + PAGE_SIZE and t.offset == PAGE_SIZE
    assert t.get_buffer() is buf and t.provider == "memfd"
    with pytest.raises(ValueError, match=r"'x'.*XRT_BO memory is a native buffer"):
        NpuTensor(cpu_info(), np.zeros(48, np.float32), MemoryType.XRT_BO)
    with pytest.raises(ValueError, match=r"'x'.*not aligned to 4096"):
        NpuTensor(cpu_info(), buf, MemoryType.XRT_BO, offset=64)
    # an XRT_BO tensor over a buffer can parent sub-tensors like a runner-allocated one
    row = sub_tensor(t, cpu_info(shape=(4,), name="row"), 16)
    assert row.offset == PAGE_SIZE + 16


def test_sub_tensor_exports_the_parent_buffer_at_its_offset():
    parent = allocate_tensor(cpu_info(shape=(2, 8)), provider="memfd")
    row = sub_tensor(parent, cpu_info(shape=(8,), name="row"), 32)
    row.numpy()[...] = 5
    fd = row.export_buffer()
    try:
        assert row.offset == 32 and row.provider == "memfd"
        mapped = NpuTensor(row.info, fd, MemoryType.DMA_FD, offset=row.offset)
        assert mapped.numpy().tolist() == [5] * 8
        whole = NpuTensor(parent.info, fd, MemoryType.DMA_FD)
        assert whole.numpy()[1].tolist() == [5] * 8 and whole.numpy()[0].tolist() == [0] * 8
    finally:
        os.close(fd)


def test_runner_allocates_with_its_memory_options(axpy_model):
    with RunnerFactory.create_runner("AXPY", axpy_model(), {"input_tensor_type": "CPU", "output_tensor_type": "CPU",
                                                            "memory_provider": "memfd"}) as r:
        x_info = r.get_tensors_info(TensorDirection.INPUT)[0]
        y_info = r.get_tensors_info(TensorDirection.OUTPUT)[0]
        x, y = r.allocate_npu_tensor(x_info), r.allocate_npu_tensor(y_info)
        assert x.provider == y.provider == "memfd"
        x.numpy()[...] = 2.0
        # the engine reads and writes through DMA_FD views of the same memory
        fx, fy = x.export_buffer(), y.export_buffer()
        try:
            xs = NpuTensor(x_info, fx, MemoryType.DMA_FD)
            ys = NpuTensor(y_info, fy, MemoryType.DMA_FD)
        finally:
            os.close(fx)
            os.close(fy)
        assert r.execute([[xs]], [[ys]]) == 0, r.last_error
        assert float(y.numpy().max()) == float(y.numpy().min()) == 5.0
    if not HEAP.exists():
        with RunnerFactory.create_runner("AXPY", axpy_model(), {"memory_strict": True}) as r:
            with pytest.raises(NpuError, match="dma_heap:system"):
                r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.INPUT)[0])


def test_large_buffers_come_and_go_from_many_threads():
    # Large buffers unmap with the GIL released; threads allocating and dropping them must not trip over that.
    before = open_fds()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(25):
                buf = Buffer.allocate(2 << 20, "memfd")
                np.frombuffer(buf, np.uint8)[::PAGE_SIZE] = 1
                t = NpuTensor(cpu_info(shape=(1 << 19,), dtype=DataType.UINT8), buf, MemoryType.XRT_BO)
                assert int(t.numpy()[PAGE_SIZE]) == 1
                del buf, t
        except BaseException as e:  # a thread's exception would otherwise only be printed
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert settled_fds(before) == before
