"""The backend conformance suite: every backend on its engine's real CPU device, against the engine used directly.

The same tests run for RunnerType.OPENVINO (OpenVINO's CPU plugin) and RunnerType.VAIML (ONNX Runtime's CPU
provider; the Vitis AI provider is not installed here, so the NPU paths are checked for what they decide). Models:
the PP-OCR classifier, recognizer and detector and silero-vad, at small shapes to stay fast. What only one engine
has (OpenVINO IR models, infer requests, ONNX Runtime session options) is in test_openvino.py / test_vaiml.py.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import numpy as np
import onnxruntime as ort
import openvino as ov
import pytest

from npurt import (
    DataType,
    JobHandle,
    MemoryLayout,
    NpuError,
    NpuFallbackWarning,
    NpuTensor,
    RunnerFactory,
    StatusCode,
    TensorDirection,
    TensorType,
    convert,
)
from npurt.factory import RunnerFactory as Factory
from tests.helpers.engines import ov_cpu_properties
from tests.helpers.models import model_or_skip
from tests.helpers.ocr import SHAPES, frame

BACKENDS = ["OPENVINO", "VAIML"]
OUTPUT = {"ocr_cls": "save_infer_model/scale_0.tmp_1", "ocr_rec": "softmax_11.tmp_0", "ocr_det": "sigmoid_0.tmp_0"}


# ---------------------------------------------------------------------------------------------------- the engines
@functools.cache
def _ov_compiled(model: str, shape: tuple[int, ...] | None) -> ov.CompiledModel:
    m = ov.Core().read_model(str(model_or_skip(model)))
    if shape is not None:
        m.reshape({m.input(0): ov.PartialShape(list(shape))})
    return ov.Core().compile_model(m, "CPU", ov_cpu_properties())


@functools.cache
def _ort_session(model: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(model_or_skip(model)), providers=["CPUExecutionProvider"])


def raw(backend: str, model: str, x: np.ndarray, static: bool = False) -> np.ndarray:
    """The engine used directly: OpenVINO compiled f32 on CPU (reshaped to x's shape when ``static``, as npurt does
    for pinned shapes), ONNX Runtime's InferenceSession.run on the model file."""
    if backend == "OPENVINO":
        return _ov_compiled(model, x.shape if static else None).create_infer_request().infer({0: x})[0].copy()
    return _ort_session(model).run(None, {"x": x})[0]


def make(backend: str, model: str, **options: Any):
    opts: dict[str, Any] = {"device": "CPU"}
    opts.update(options)
    return RunnerFactory.create_runner(backend, model_or_skip(model), opts)


def pinned(backend: str, model: str, **options: Any):
    """A runner with the model's input pinned to the test's small static shape."""
    return make(backend, model, shapes={"x": list(SHAPES[model])}, **options)


def out_info(runner, shape: tuple[int, ...], view: TensorType = TensorType.CPU):
    """The output port's info with the shape a run produces (engines may leave dims open until the run)."""
    info = runner.get_tensors_info(TensorDirection.OUTPUT, view)[0]
    return info if info.is_static else info.replace(shape=shape)


def execute(runner, ins, outs) -> None:
    status = runner.execute([ins], [outs])
    assert status is StatusCode.SUCCESS, runner.last_error


def cpu_io(runner, model: str, x: np.ndarray):
    info = runner.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=x.shape)
    want = raw_shape(model, x.shape)
    return [NpuTensor(info, x)], [NpuTensor(out_info(runner, want), np.zeros(want, np.float32))]


def raw_shape(model: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    n, _, h, w = shape
    return {"ocr_cls": (n, 2), "ocr_rec": (n, w // 8, 6625), "ocr_det": (n, 1, h, w)}[model]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


# ---------------------------------------------------------------------------------------------------- shapes
def test_dynamic_dims_compile_once_and_match_the_engine(backend):
    """No `shapes`: the model as it is; every width runs on the one engine, each result the engine's own."""
    with make(backend, "ocr_rec") as r:
        assert r.device_info.shape_mode == "dynamic" and r.device_info.hw_view == "device"
        assert r.get_tensor_info_by_name("x", TensorType.CPU).shape == (-1, 3, -1, -1)
        for n, w in ((1, 160), (2, 320), (1, 96)):
            x = frame((n, 3, 48, w), seed=w)
            got = r.run({"x": x})[OUTPUT["ocr_rec"]]
            np.testing.assert_array_equal(got, raw(backend, "ocr_rec", x))
        # execute() with fresh user tensors of those shapes, on the same engine
        x = frame((1, 3, 48, 128), seed=9)
        ins, outs = cpu_io(r, "ocr_rec", x)
        execute(r, ins, outs)
        np.testing.assert_array_equal(outs[0].result(), raw(backend, "ocr_rec", x))
        assert r.stats["compiles"] == 1


def test_outputs_shaped_by_the_run_fill_a_large_enough_tensor(backend):
    with make(backend, "ocr_det") as r:
        out = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        assert -1 in out.shape
        x = frame((1, 3, 96, 128), seed=3)
        big = r.allocate_npu_tensor(out.replace(shape=(1, 1, 160, 160)))
        execute(r, [NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=x.shape), x)], [big])
        assert big.result_info.shape == (1, 1, 96, 128) and big.info.shape == (1, 1, 160, 160)
        np.testing.assert_array_equal(big.result(), raw(backend, "ocr_det", x))
        small = r.allocate_npu_tensor(out.replace(shape=(1, 1, 32, 32)))
        status = r.execute([[NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=x.shape), x)]],
                           [[small]])
        assert status is StatusCode.INVALID_OUTPUT
        assert "[1, 1, 96, 128]" in r.last_error


def test_pinned_shapes_compile_static_engines(backend):
    with pinned(backend, "ocr_rec", input_tensor_type="CPU", output_tensor_type="CPU") as r:
        assert r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0].shape == (1, 3, 48, 320)
        x = frame(SHAPES["ocr_rec"], seed=1)
        ins, outs = cpu_io(r, "ocr_rec", x)
        execute(r, ins, outs)
        np.testing.assert_array_equal(outs[0].numpy(), raw(backend, "ocr_rec", x, static=True))
        narrow = frame((1, 3, 48, 160), seed=7)
        first = r.run({"x": narrow})[OUTPUT["ocr_rec"]]
        assert first.shape == (1, 20, 6625)
        np.testing.assert_array_equal(first, raw(backend, "ocr_rec", narrow))  # on the dynamic engine
        assert r.stats["compiles"] == 2  # the pinned shape's engine and the dynamic one
        r.run({"x": frame((1, 3, 48, 96), seed=8)})
        assert r.stats["compiles"] == 2
        bad = r.get_tensor_info_by_name("x", TensorType.CPU).replace(shape=(1, 4, 48, 320))
        status = r.execute([[NpuTensor(bad, np.zeros(bad.shape, np.float32))]], [outs])
        assert status is StatusCode.INVALID_INPUT and "[1, 4, 48, 320]" in r.last_error


def test_static_shapes_option_compiles_each_signature_once(backend):
    with make(backend, "ocr_cls", static_shapes=True, max_compiled_shapes=2) as r:
        assert r.device_info.shape_mode == "static"
        for w in (192, 96, 192, 160, 192, 96):
            x = frame((1, 3, 48, w), seed=w)
            np.testing.assert_allclose(r.run({"x": x})[OUTPUT["ocr_cls"]], raw(backend, "ocr_cls", x),
                                       rtol=1e-5, atol=1e-6)
        assert r.stats["compiles"] == 4  # 192, 96, 160 (drops 96), 96 again


# ---------------------------------------------------------------------------------------------------- views
def test_device_views_on_cpu_are_the_models_own(backend):
    """On CPU the HW view is the CPU view: nothing is converted, results are the engine's."""
    with pinned(backend, "ocr_cls") as r:
        hw, cpu = r.get_tensor_info_by_name("x"), r.get_tensor_info_by_name("x", TensorType.CPU)
        assert hw == cpu.replace(tensor_type=TensorType.HW)
        x = frame(SHAPES["ocr_cls"], seed=2)
        xt = r.allocate_npu_tensor(hw)
        xt.numpy()[...] = x
        y = r.allocate_npu_tensor(out_info(r, (1, 2), TensorType.HW))
        execute(r, [xt], [y])
        np.testing.assert_array_equal(y.numpy(), raw(backend, "ocr_cls", x, static=True))
        ins, outs = cpu_io(r, "ocr_cls", x)  # CPU-labelled tensors on the HW ports: the same layout, no copy
        execute(r, ins, outs)
        assert r.stats["copies"] == 0


NPU_VIEW = {"OPENVINO": (lambda s: (s[0], s[2], s[3], s[1]), DataType.FP16, MemoryLayout.NHWC),
            "VAIML": (lambda s: (s[2], (s[1] + 3) // 4, s[3], s[0], 4), DataType.BF16, MemoryLayout.HCWNC4)}


@pytest.mark.parametrize("model", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_npu_views_are_built_into_the_engine(backend, model):
    x = frame(SHAPES[model], seed=1)
    with pinned(backend, model, hw_view="npu") as r:
        assert r.device_info.hw_view == "npu" and r.device_info.shape_mode == "static"
        hw_in = r.get_tensor_info_by_name("x")
        shape_of, dtype, layout = NPU_VIEW[backend]
        assert (hw_in.shape, hw_in.data_type, hw_in.memory_layout) == (shape_of(SHAPES[model]), dtype, layout)
        xt = r.allocate_npu_tensor(hw_in)
        convert(NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU), x), xt)
        y = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT)[0])
        execute(r, [xt], [y])
        assert r.stats["copies"] == 0 and y.info.data_type is dtype
        got = np.empty(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0].shape, np.float32)
        convert(y, NpuTensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0], got))
        # the engine saw x rounded to FP16 / BF16, and its output was rounded once more
        np.testing.assert_allclose(got, raw(backend, model, x), rtol=3e-2, atol=3e-2)
        # CPU tensors on HW ports: one counted conversion each way, the same values
        ins, outs = cpu_io(r, model, x)
        execute(r, ins, outs)
        assert r.stats["copies"] == 2
        assert r.stats["bytes_copied"] == xt.nbytes + outs[0].nbytes
        np.testing.assert_array_equal(outs[0].numpy(), got)


# ---------------------------------------------------------------------------------------------------- zero copy
def test_bound_memory_is_used_in_place(backend):
    """A tensor's live memory is what the engine reads: change it in place and the result follows, with no copy and
    no new binding; a new tensor on the port is bound anew."""
    with pinned(backend, "ocr_cls", output_tensor_type="CPU") as r:
        xt = r.allocate_npu_tensor(r.get_tensor_info_by_name("x"))
        y = NpuTensor(out_info(r, (1, 2)), np.zeros((1, 2), np.float32))
        results = []
        for seed in (4, 5):
            x = frame(SHAPES["ocr_cls"], seed=seed)
            xt.numpy()[...] = x
            execute(r, [xt], [y])
            np.testing.assert_array_equal(y.numpy(), raw(backend, "ocr_cls", x, static=True))
            results.append(y.numpy().copy())
        assert not np.array_equal(*results)
        other = r.allocate_npu_tensor(r.get_tensor_info_by_name("x"))
        other.numpy()[...] = frame(SHAPES["ocr_cls"], seed=4)
        execute(r, [other], [y])
        np.testing.assert_array_equal(y.numpy(), results[0])
        assert r.stats["copies"] == 0


def test_run_gives_new_arrays_equal_to_the_engines(backend):
    with make(backend, "ocr_cls") as r:
        x = frame((2, 3, 48, 192), seed=2)
        a = r.run({"x": x})
        b = r.run({"x": x})
        assert list(a) == [OUTPUT["ocr_cls"]]
        assert a[OUTPUT["ocr_cls"]] is not b[OUTPUT["ocr_cls"]]
        np.testing.assert_array_equal(a[OUTPUT["ocr_cls"]], raw(backend, "ocr_cls", x))
        with pytest.raises(ValueError, match="dtype float64"):
            r.run({"x": x.astype(np.float64)})
        with pytest.raises(ValueError, match=r"unknown inputs \['y'\] and missing inputs \['x'\]"):
            r.run({"y": x})


@pytest.mark.parametrize("dims", [[2, 3], ["n", 3]], ids=["static", "open"])
def test_run_takes_and_gives_bf16_as_execute_does(backend, tmp_path, dims):
    """BF16 ports through run(): numpy holds their bits as uint16, which the engines take for UINT16 (both refused
    the run). The bits go in and come out as execute's tensors carry them; Cast BF16 -> FP32 -> BF16 is exact."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["y"], ["z"], to=TensorProto.BFLOAT16)], "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims),
         helper.make_tensor_value_info("z", TensorProto.BFLOAT16, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "bf16.onnx"
    onnx.save(model, str(path))
    values = np.array([[0.5, -1.5, 3.0], [1e-3, 65504.0, -0.0]], np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # BF16: the top half of each float
    values = (bits.astype(np.uint32) << 16).view(np.float32)  # what those bits are
    with RunnerFactory.create_runner(backend, path, {"device": "CPU"}) as r:
        out = r.run({"x": bits})
        np.testing.assert_array_equal(out["y"], values)
        assert out["z"].dtype == np.uint16
        np.testing.assert_array_equal(out["z"], bits)
        info = {t.name: t for t in r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)}
        assert info["x"].data_type is DataType.BF16


# ---------------------------------------------------------------------------------------------------- concurrency
def test_eight_threads_share_one_runner(backend):
    with pinned(backend, "ocr_cls") as r:
        xs = [frame(SHAPES["ocr_cls"], seed=20 + k) for k in range(8)]
        expected = [raw(backend, "ocr_cls", x, static=True) for x in xs]
        errors: list[str] = []
        barrier = threading.Barrier(8)

        def worker(k: int) -> None:
            ins, outs = cpu_io(r, "ocr_cls", xs[k])
            barrier.wait()
            for _ in range(5):
                outs[0].numpy()[...] = np.nan
                if r.execute([ins], [outs]) is not StatusCode.SUCCESS:
                    errors.append(r.last_error)
                elif not np.array_equal(outs[0].numpy(), expected[k]):
                    errors.append(f"thread {k}: wrong result")

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


@pytest.mark.parametrize("order", ["submission", "completion"])
def test_execute_async_callbacks(backend, order):
    n = 6
    with pinned(backend, "ocr_cls", max_concurrent_runs=2, callback_order=order) as r:
        assert r.max_concurrent_runs == 2
        xs = [frame(SHAPES["ocr_cls"], seed=10 + k) for k in range(n)]
        sets = [cpu_io(r, "ocr_cls", x) for x in xs]
        seen: list[tuple[int, StatusCode]] = []
        done = threading.Event()

        def callback(handle: JobHandle) -> None:
            seen.append((handle.job_id, handle.status))
            if len(seen) == n:
                done.set()

        ids = []
        for ins, outs in sets:
            while (job := r.execute_async([ins], [outs], callback)).status is StatusCode.RESOURCE_UNAVAILABLE:
                threading.Event().wait(0.001)  # every run busy: transient, retry
            assert job.status is StatusCode.SUCCESS, r.last_error
            ids.append(job.job_id)
        assert done.wait(60)
        assert all(status is StatusCode.SUCCESS for _, status in seen)
        assert ([j for j, _ in seen] if order == "submission" else sorted(j for j, _ in seen)) == ids
        for x, (_, outs) in zip(xs, sets):
            np.testing.assert_array_equal(outs[0].numpy(), raw(backend, "ocr_cls", x, static=True))


@pytest.mark.parametrize("runs", [1, 2])
def test_callbacks_that_resubmit_and_wait_on_their_own_thread(backend, runs):
    """Completion callbacks run on the thread that ended the job (a worker, or OpenVINO's reporting thread): one
    that submits a job and waits for it must not wait for itself, even with a single run allowed at a time, and
    chains of resubmitting callbacks keep going."""
    with pinned(backend, "ocr_cls", max_concurrent_runs=runs, callback_order="completion") as r:
        x = frame(SHAPES["ocr_cls"], seed=7)
        ins, outs = cpu_io(r, "ocr_cls", x)
        inner_ins, inner_outs = cpu_io(r, "ocr_cls", x)
        inner: list[StatusCode] = []
        threads: set[str] = set()
        chained = threading.Event()
        count = [0]

        def waits(handle: JobHandle) -> None:
            threads.add(threading.current_thread().name)
            job = r.execute_async([inner_ins], [inner_outs])
            while job.status is StatusCode.RESOURCE_UNAVAILABLE:  # with runs=1 the ended job may hold it a moment
                threading.Event().wait(0.001)
                job = r.execute_async([inner_ins], [inner_outs])
            inner.append(r.wait(job, 30_000))

        def chain(handle: JobHandle) -> None:
            assert handle.status is StatusCode.SUCCESS
            count[0] += 1
            if count[0] == 20:
                chained.set()
                return
            job = r.execute_async([ins], [outs], chain)
            assert job.status is StatusCode.SUCCESS, r.last_error

        assert r.execute_async([ins], [outs], waits).status is StatusCode.SUCCESS
        deadline = threading.Event()
        for _ in range(3000):
            if inner:
                break
            deadline.wait(0.01)
        assert inner == [StatusCode.SUCCESS]
        assert threading.main_thread().name not in threads
        assert r.execute_async([ins], [outs], chain).status is StatusCode.SUCCESS
        assert chained.wait(60)
        np.testing.assert_array_equal(inner_outs[0].numpy(), raw(backend, "ocr_cls", x, static=True))


def test_execute_async_wait_and_wait_any(backend):
    with pinned(backend, "ocr_rec", max_concurrent_runs=2) as r:
        xs = [frame(SHAPES["ocr_rec"], seed=30 + k) for k in range(6)]
        sets = [cpu_io(r, "ocr_rec", x) for x in xs]
        jobs: dict[int, int] = {}
        pending = list(range(len(sets)))
        while pending or jobs:
            while pending:
                k = pending[0]
                job = r.execute_async([sets[k][0]], [sets[k][1]])
                if job.status is StatusCode.RESOURCE_UNAVAILABLE:
                    break
                assert job.status is StatusCode.SUCCESS, r.last_error
                jobs[job.job_id] = pending.pop(0)
            ended = r.wait_any(list(jobs), 30_000)
            assert ended.status is StatusCode.SUCCESS, r.last_error
            del jobs[ended.job_id]
            assert r.wait(ended, 0) is StatusCode.INVALID_JOB_ID  # wait_any collected it
        for x, (_, outs) in zip(xs, sets):
            np.testing.assert_array_equal(outs[0].numpy(), raw(backend, "ocr_rec", x, static=True))
        assert r.wait_any([], 0).status is StatusCode.INVALID_JOB_ID
        assert r.wait_any([12345], 0) == JobHandle(StatusCode.INVALID_JOB_ID, 12345)
        # close() lets jobs in flight end with their status
        in_flight = [r.execute_async([ins], [outs]) for ins, outs in sets[:2]]
        r.close()
        assert [r.wait(j, 0) for j in in_flight] == [StatusCode.SUCCESS] * 2
        stats = r.stats
        assert stats["jobs_submitted"] == stats["jobs_completed"] == 8 and stats["jobs_failed"] == 0


def test_execute_while_async_jobs_hold_every_run(backend):
    with pinned(backend, "ocr_cls", max_concurrent_runs=2) as r:
        sets = [cpu_io(r, "ocr_cls", frame(SHAPES["ocr_cls"], seed=40 + k)) for k in range(3)]
        jobs = [r.execute_async([ins], [outs]) for ins, outs in sets[:2]]
        assert [j.status for j in jobs] == [StatusCode.SUCCESS] * 2, r.last_error
        statuses = []
        worker = threading.Thread(target=lambda: statuses.append(r.execute([sets[2][0]], [sets[2][1]])), daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "execute() waited forever"
        assert statuses == [StatusCode.SUCCESS], r.last_error
        assert [r.wait(j, 10_000) for j in jobs] == [StatusCode.SUCCESS] * 2


# ---------------------------------------------------------------------------------------------------- devices
def test_npu_request_falls_back_or_raises(backend):
    if Factory.available_backends()[backend].npu_present():
        pytest.skip("this machine has the backend's NPU")
    with pytest.warns(NpuFallbackWarning, match="NPU requested"):
        r = pinned(backend, "ocr_cls", device="NPU")
    with r:
        info = r.device_info
        assert (info.requested, info.attached, info.fell_back) == ("NPU", "CPU", True)
        assert ("intel_vpu" if backend == "OPENVINO" else "Ryzen AI") in info.reason
        assert info.hw_view == "device"  # the views of the device that runs: CPU
        assert r.get_tensor_info_by_name("x").shape == SHAPES["ocr_cls"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NpuError, match="NPU is not available|not installed"):
            pinned(backend, "ocr_cls", device="NPU", fallback="error")


def test_auto_takes_what_is_there(backend):
    with pinned(backend, "ocr_cls", device="AUTO") as r:
        info = r.device_info
        assert not info.fell_back
        if not Factory.available_backends()[backend].npu_present():
            assert info.attached == "CPU" and "NPU" in dict(info.skipped)


def test_unreadable_model_is_a_clear_error(backend, tmp_path):
    bogus = tmp_path / "bogus.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(NpuError, match="bogus.onnx"):
        RunnerFactory.create_runner(backend, bogus, {"device": "CPU"})


def test_closed_runner_fails_execution_and_queries(backend):
    r = pinned(backend, "ocr_cls")
    ins, outs = cpu_io(r, "ocr_cls", frame(SHAPES["ocr_cls"]))
    r.close()
    assert r.execute([ins], [outs]) is StatusCode.FAILURE and "closed" in r.last_error
    assert r.execute_async([ins], [outs]).status is StatusCode.FAILURE
    with pytest.raises(NpuError, match="closed"):
        r.get_tensors_info(TensorDirection.INPUT)
    r.close()  # idempotent


# ---------------------------------------------------------------------------------------------------- stateful model
def test_silero_vad_state_carried_by_hand_matches_the_engine(backend):
    path = model_or_skip("silero_vad")
    if backend == "OPENVINO":
        try:
            ov.Core().read_model(str(path))
        except RuntimeError as e:  # OpenVINO's ONNX frontend refuses this export: npurt says so, with the reason
            with pytest.raises(NpuError, match="OpenVINO cannot read the model") as refused:
                RunnerFactory.create_runner(backend, path, {"device": "CPU"})
            assert str(e).splitlines()[-1].strip() in str(refused.value)
            return
    with RunnerFactory.create_runner(backend, path, {"device": "CPU"}) as r:
        assert {s.name: s.shape for s in r.input_specs} == {"input": (None, None), "state": (2, None, 128), "sr": ()}
        raw_session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        state = np.zeros((2, 1, 128), np.float32)
        mine = state.copy()
        rng = np.random.default_rng(11)
        sr = np.array(16000, np.int64)
        for _ in range(4):
            chunk = (rng.standard_normal((1, 576)) * 0.1).astype(np.float32)
            prob, state = raw_session.run(None, {"input": chunk, "state": state, "sr": sr})
            out = r.run({"input": chunk, "state": mine, "sr": sr})
            got, mine = out["output"], out["stateN"]
            if backend == "VAIML":
                np.testing.assert_array_equal(got, prob)
                np.testing.assert_array_equal(mine, state)
            else:
                np.testing.assert_allclose(got, prob, rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(mine, state, rtol=1e-4, atol=1e-5)
        assert r.stats["copies"] == 0 and r.stats["compiles"] == 1


def test_infer_queue_runs_every_frame_through_its_slots(backend):
    from npurt import InferQueue

    with pinned(backend, "ocr_cls", max_concurrent_runs=3, callback_order="completion") as r:
        queue = InferQueue(r, output_shapes={OUTPUT["ocr_cls"]: (1, 2)})
        assert len(queue) == 7  # three run, four wait and start as jobs end
        xs = [frame(SHAPES["ocr_cls"], seed=60 + k) for k in range(10)]
        got: dict[int, np.ndarray] = {}
        lock = threading.Lock()

        def collect(slot, k):
            assert slot.status is StatusCode.SUCCESS, slot.error
            with lock:
                got[k] = slot.results()[OUTPUT["ocr_cls"]].copy()

        queue.set_callback(collect)
        for k, x in enumerate(xs):
            assert 0 <= queue.start_async({"x": x}, userdata=k) < 7
        assert queue.wait_all(60)
        assert queue.is_ready() and sorted(got) == list(range(10))
        for k, x in enumerate(xs):
            np.testing.assert_array_equal(got[k], raw(backend, "ocr_cls", x, static=True))


def test_infer_queue_fed_one_array_again_sees_its_new_values_and_shape(backend):
    """The queue reuses its wrapping of an array fed again (its plan and binding); refilled values are read, and an
    array whose shape was reassigned in place is wrapped anew."""
    from npurt import InferQueue

    with pinned(backend, "ocr_cls", max_concurrent_runs=2) as r:
        queue = InferQueue(r, output_shapes={OUTPUT["ocr_cls"]: (1, 2)})
        got: list[np.ndarray] = []
        queue.set_callback(lambda slot, _: got.append(slot.results()[OUTPUT["ocr_cls"]].copy()))
        buffer = frame(SHAPES["ocr_cls"], seed=70)
        for seed in (70, 71, 72):
            buffer[...] = frame(SHAPES["ocr_cls"], seed=seed)  # the app refills its one buffer
            queue.start_async({"x": buffer})
            assert queue.wait_all(60)
            np.testing.assert_array_equal(got[-1], raw(backend, "ocr_cls", buffer, static=True))
        before = got[-1]
        buffer.shape = (1, 3, 96, 96)  # the same bytes in another shape: a run at that shape, not the old one
        queue.start_async({"x": buffer})
        assert queue.wait_all(60)
        np.testing.assert_array_equal(got[-1], raw(backend, "ocr_cls", buffer, static=True))
        assert not np.array_equal(got[-1], before)


def test_npurts_own_backends_are_its_entry_points():
    """factory.BUILT_IN finds npurt's own backends without reading every distribution's metadata: it must name what
    pyproject.toml's entry points name, or a load would take another class than AUTO and the listings take."""
    from importlib import metadata

    from npurt import factory

    installed = {ep.name.upper(): ep.value for ep in metadata.entry_points(group=factory.ENTRY_POINT_GROUP)}
    assert {name: installed.get(name) for name in factory.BUILT_IN} == factory.BUILT_IN
