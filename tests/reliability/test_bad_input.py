"""The bad-input matrix, for both backends on a real model: each case's exact exception or StatusCode and a
message that names the tensor and the problem (docs/reliability.md lists them)."""

from __future__ import annotations

import errno
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npurt import (
    DataType,
    JobHandle,
    MemoryLayout,
    MemoryType,
    NpuError,
    NpuTensor,
    RunnerFactory,
    RunnerType,
    StatusCode,
    TensorDirection,
    TensorType,
)
from tests.helpers.models import model_or_skip

BACKENDS = [RunnerType.OPENVINO, RunnerType.VAIML]
SHAPE = (1, 3, 48, 192)


@pytest.fixture(scope="module", params=BACKENDS, ids=lambda t: t.name)
def runner(request):
    path = model_or_skip("ocr_cls")
    r = RunnerFactory.create_runner(request.param, path, {"shapes": {"x": list(SHAPE)}, "device": "CPU",
                                                          "output_tensor_type": "CPU", "hw_view": "npu"})
    yield r
    r.close()


@pytest.fixture
def io(runner):
    x_cpu = runner.get_tensor_info_by_name("x", TensorType.CPU)
    out = runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
    x = NpuTensor(x_cpu, np.zeros(x_cpu.shape, np.float32))
    y = NpuTensor(out, np.zeros(out.shape, np.float32))
    return x_cpu, out, x, y


def check(runner, status, fragment, ins, outs):
    got = runner.execute(ins, outs)
    assert got is status, (got, runner.last_error)
    assert fragment in runner.last_error, runner.last_error
    job = runner.execute_async(ins, outs)  # the same verdict on the async path, at submission
    assert job == JobHandle(status, 0)
    assert fragment in runner.last_error


def test_wrong_number_of_inputs_and_outputs(runner, io):
    _, out, x, y = io
    check(runner, StatusCode.INVALID_INPUT, "2 input tensors given, the model has 1: ['x']", [[x, x]], [[y]])
    check(runner, StatusCode.INVALID_OUTPUT, f"2 output tensors given, the model has 1: ['{out.name}']",
          [[x]], [[y, y]])


def test_unknown_tensor_names(runner, io):
    x_cpu, _, _, y = io
    stray = NpuTensor(x_cpu.replace(name="image"), np.zeros(SHAPE, np.float32))
    check(runner, StatusCode.INVALID_INPUT, "no input tensor for 'x'; unknown names ['image']", [[stray]], [[y]])


def test_wrong_shape(runner, io):
    x_cpu, _, _, y = io
    four_channels = NpuTensor(x_cpu.replace(shape=(1, 4, 48, 192)), np.zeros((1, 4, 48, 192), np.float32))
    check(runner, StatusCode.INVALID_INPUT, "shape [1, 4, 48, 192] does not fit input 'x'", [[four_channels]], [[y]])
    hw = runner.get_tensor_info_by_name("x")
    bad_hw = runner.allocate_npu_tensor(hw.replace(shape=tuple(d + 1 for d in hw.shape)))
    check(runner, StatusCode.INVALID_INPUT, f"input 'x': HW shape {[d + 1 for d in hw.shape]}, expected "
          f"{list(hw.shape)}", [[bad_hw]], [[y]])


def test_wrong_dtype(runner, io):
    x_cpu, _, _, y = io
    half = NpuTensor(x_cpu.replace(data_type=DataType.FP16), np.zeros(SHAPE, np.float16))
    check(runner, StatusCode.INVALID_INPUT, "input 'x' (CPU view): data_type is FP16, expected FLOAT32",
          [[half]], [[y]])


def test_wrong_view_for_the_port(runner, io):
    # a HW tensor laid out as the CPU view (NCHW) is not the port's HW view
    x_cpu, _, _, y = io
    hw = runner.get_tensor_info_by_name("x")
    nchw = runner.allocate_npu_tensor(hw.replace(shape=SHAPE, memory_layout=MemoryLayout.NCHW))
    check(runner, StatusCode.INVALID_INPUT, "input 'x': HW shape [1, 3, 48, 192]", [[nchw]], [[y]])
    # a CPU tensor with the port's HW dtype but the CPU layout
    mixed = NpuTensor(x_cpu.replace(data_type=hw.data_type), np.zeros(SHAPE, hw.data_type.numpy))
    check(runner, StatusCode.INVALID_INPUT, f"data_type is {hw.data_type.name}, expected FLOAT32", [[mixed]], [[y]])


def test_buffer_too_small(io):
    x_cpu = io[0]
    with pytest.raises(ValueError, match=r"tensor 'x': buffer holds 100 bytes, CPU \[1, 3, 48, 192\] FLOAT32 NCHW "
                                         r"needs 110592"):
        NpuTensor(x_cpu, np.zeros(100, np.uint8))


def test_read_only_output(runner, io):
    x_cpu, out, x, _ = io
    frozen = np.zeros(out.shape, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=f"tensor '{out.name}': an output tensor needs writable memory"):
        NpuTensor(out, frozen)
    sneaky = NpuTensor(out.replace(direction=TensorDirection.INPUT), frozen)  # declared as an input
    check(runner, StatusCode.INVALID_OUTPUT, f"output '{out.name}' is read-only", [[x]], [[sneaky]])


def test_non_contiguous_array(io):
    x_cpu = io[0]
    strided = np.zeros((1, 3, 48, 384), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="tensor 'x': buffer is not C-contiguous"):
        NpuTensor(x_cpu, strided)


def test_batch_longer_than_batch_size(runner, io):
    _, _, x, y = io
    assert runner.get_batch_size() == 1
    check(runner, StatusCode.INVALID_INPUT, "inputs has 2 batch slots; this runner takes 1 to 1", [[x], [x]],
          [[y], [y]])


def test_closed_and_bogus_fds(io):
    x_cpu = io[0]
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(ValueError, match="tensor 'x'.*pipe"):
        NpuTensor(x_cpu, r, MemoryType.DMA_FD)
    os.close(r)
    for fd in (r, 987_654):  # closed, never open
        with pytest.raises(OSError) as e:
            NpuTensor(x_cpu, fd, MemoryType.DMA_FD)
        assert e.value.errno == errno.EBADF and "tensor 'x'" in str(e.value)
    with pytest.raises(ValueError, match="tensor 'x'"):
        NpuTensor(x_cpu, -1, MemoryType.DMA_FD)


def test_dma_fd_offset_past_the_end(runner, io):
    x_cpu = io[0]
    src = runner.allocate_npu_tensor(x_cpu)
    fd = src.export_buffer()
    assert fd >= 0
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        past = ((x_cpu.size_in_bytes // page) + 2) * page
        with pytest.raises(ValueError, match="tensor 'x'"):
            NpuTensor(x_cpu, fd, MemoryType.DMA_FD, offset=past)
        ok = NpuTensor(x_cpu, fd, MemoryType.DMA_FD)
        ok.numpy()[0, 0, 0, 0] = 5.0
        assert src.numpy()[0, 0, 0, 0] == 5.0
    finally:
        os.close(fd)


def test_wait_on_bad_jobs_and_negative_timeout(runner, io):
    _, _, x, y = io
    assert runner.wait(JobHandle(StatusCode.SUCCESS, 0), 0) is StatusCode.INVALID_JOB_ID
    job = runner.execute_async([[x]], [[y]])
    assert job.status is StatusCode.SUCCESS
    assert runner.wait(job, -1) is StatusCode.INVALID_INPUT
    assert "timeout_ms must be None" in runner.last_error
    assert runner.wait(job, 10_000) is StatusCode.SUCCESS
    assert runner.wait(job, 0) is StatusCode.INVALID_JOB_ID
    assert f"job {job.job_id} is unknown to this runner or was already collected" in runner.last_error
    other = RunnerFactory.create_runner(RunnerType.AXPY if hasattr(RunnerType, "AXPY") else "AXPY",
                                        _axpy_path(runner), None)
    try:
        mine = runner.execute_async([[x]], [[y]])
        assert other.wait(mine, 0) is StatusCode.INVALID_JOB_ID
        assert runner.wait(mine, 10_000) is StatusCode.SUCCESS
    finally:
        other.close()


def _axpy_path(runner):
    import json
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"a": 1.0, "b": 0.0, "shape": [1, 2]}, f)
    f.close()
    return f.name


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda t: t.name)
@pytest.mark.parametrize("options, match", [
    ({"threads": 4}, r"unknown option 'threads'; valid options: device, fallback"),
    ({"device": "FPGA"}, r"option 'device': 'FPGA' is not one of AUTO, NPU, CPU, GPU"),
    ({"fallback": "maybe"}, r"option 'fallback': 'maybe' is not one of cpu, error"),
    ({"max_concurrent_runs": -1}, r"option 'max_concurrent_runs': -1 is not a positive integer"),
    ({"shapes": {"image": [1, 3, 48, 192]}}, r"option 'shapes': the model has no input 'image'"),
    ({"output_tensor_type.nope": "CPU"}, r"the model has no output 'nope'"),
])
def test_unknown_options_and_values(backend, options, match):
    path = model_or_skip("ocr_cls")
    with pytest.raises(ValueError, match=match):
        RunnerFactory.create_runner(backend, path, {"shapes": {"x": list(SHAPE)}, **options})


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda t: t.name)
def test_missing_and_corrupt_model_files(backend, tmp_path):
    with pytest.raises(ValueError, match="model file not found"):
        RunnerFactory.create_runner(backend, tmp_path / "nope.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(os.urandom(4096))
    with pytest.raises(NpuError, match="corrupt.onnx"):
        RunnerFactory.create_runner(backend, corrupt)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model_or_skip("ocr_cls").read_bytes()[:50_000])
    with pytest.raises(NpuError, match="truncated.onnx"):
        RunnerFactory.create_runner(backend, truncated, {"shapes": {"x": list(SHAPE)}})


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda t: t.name)
def test_model_with_an_operator_the_engine_cannot_run(backend, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example.npurt")
    model = helper.make_model(helper.make_graph([node], "frob", [x], [y]), ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.npurt", 1)])
    path = tmp_path / "frob.onnx"
    onnx.save(model, path)
    with pytest.raises(NpuError, match="Frobnicate"):
        RunnerFactory.create_runner(backend, path)
