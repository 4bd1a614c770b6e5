"""RunnerType.VAIML on ONNX Runtime's real CPU provider with the PP-OCR and silero-vad models (small shapes).

The Vitis AI provider is not installed here (it ships only in the Ryzen AI SDK's onnxruntime build), so
these tests check what the NPU path decides on such a machine (fallback, reasons, errors) and run every
view and execution path on the CPU provider against plain ``InferenceSession.run``.
"""

from __future__ import annotations

import functools
import threading
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from models import model_or_skip
from npurt import (
    DataType,
    NpuError,
    NpuFallbackWarning,
    NpuTensor,
    RunnerFactory,
    RunnerType,
    StatusCode,
    TensorDirection,
    TensorType,
    convert,
)
from npurt.backends.vaiml import CPU_EP, VITISAI_EP, VaimlRunner
from ocr import SHAPES, frame, ocr_runner


def make(model: str, **options) -> VaimlRunner:
    runner = ocr_runner(RunnerType.VAIML, model, **options)
    assert isinstance(runner, VaimlRunner)
    return runner


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even) -> float32."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


@functools.cache
def raw_session(model: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(model_or_skip(model)), providers=[CPU_EP])


def raw_ort(model: str, x: np.ndarray) -> np.ndarray:
    """Plain ONNX Runtime on the original model."""
    return raw_session(model).run(None, {"x": x})[0]


def cpu_tensor(runner, direction: TensorDirection, array: np.ndarray | None = None) -> NpuTensor:
    info = runner.get_tensors_info(direction, TensorType.CPU)[0]
    return NpuTensor(info, np.zeros(info.shape, info.numpy_dtype) if array is None else array)


def tensors(runner, view: TensorType, x: np.ndarray | None = None):
    """Runner-allocated input/output tensors in ``view``, the input holding ``x`` (converted to the view)."""
    ins = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.INPUT, view)]
    outs = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.OUTPUT, view)]
    if x is not None:
        convert(cpu_tensor(runner, TensorDirection.INPUT, x), ins[0])
    return ins, outs


def as_cpu(runner, t: NpuTensor) -> np.ndarray:
    """An output tensor's values in the CPU view (float32)."""
    if t.info.tensor_type is TensorType.CPU:
        return t.numpy().copy()
    out = cpu_tensor(runner, TensorDirection.OUTPUT)
    convert(t, out)
    return out.numpy()


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


# ------------------------------------------------------------------------------------------ views
@pytest.mark.parametrize("model", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_cpu_views_match_raw_onnxruntime_exactly(model):
    x = frame(SHAPES[model], seed=1)
    with make(model, input_tensor_type="CPU", output_tensor_type="CPU") as r:
        ins, outs = tensors(r, TensorType.CPU, x)
        execute(r, ins, outs)
        np.testing.assert_array_equal(outs[0].numpy(), raw_ort(model, x))
        assert r.stats["copies"] == 0


@pytest.mark.parametrize("model", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_hw_views_match_raw_onnxruntime_within_bf16(model):
    x = frame(SHAPES[model], seed=2)
    with make(model) as r:
        hw_in = r.get_tensors_info(TensorDirection.INPUT, TensorType.HW)[0]
        n, c, h, w = SHAPES[model]
        assert (hw_in.shape, hw_in.data_type, hw_in.memory_layout.name) == ((h, 1, w, n, 4), DataType.BF16, "HCWNC4")
        ins, outs = tensors(r, TensorType.HW, x)
        assert outs[0].info.data_type is DataType.BF16
        execute(r, ins, outs)
        y = as_cpu(r, outs[0])
        # The engine saw x rounded to BF16 and its result is rounded to BF16 once more.
        ref = raw_ort(model, bf16_round(x))
        np.testing.assert_allclose(y, ref, rtol=2 ** -7, atol=1e-6)
        assert np.array_equal(y, bf16_round(ref)) or np.abs(y - bf16_round(ref)).max() <= 2 ** -7 * np.abs(ref).max()
        assert r.stats["copies"] == 0


def test_hw_output_with_cpu_input_goes_through_the_opset_conversion():
    """A CPU input and a HW output: the model (opset 11) is converted to opset 13 for the BF16 Cast."""
    x = frame(SHAPES["ocr_cls"], seed=3)
    with make("ocr_cls", input_tensor_type="CPU") as r:
        ins, outs = tensors(r, TensorType.CPU, x)
        outs = [r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.HW)[0])]
        execute(r, ins, outs)
        ref = raw_ort("ocr_cls", x)
        np.testing.assert_array_equal(as_cpu(r, outs[0]), bf16_round(ref))
        opsets = {o.domain: o.version for o in __import__("onnx").load(str(model_or_skip("ocr_cls"))).opset_import}
        assert opsets[""] == 11


# ------------------------------------------------------------------------------------------ zero copy
def test_hw_path_is_zero_copy_by_address(cls_hw):
    r = cls_hw
    before = r.stats["copies"]
    ins, outs = tensors(r, TensorType.HW, frame(SHAPES["ocr_cls"], seed=4))
    engine = r._default.engine
    made = engine.bindings_made
    execute(r, ins, outs)
    first = outs[0].numpy().copy()
    binding = r.io_binding_for(ins, outs)
    assert binding.get_outputs()[0].data_ptr() == outs[0].get_virtual_address()
    assert engine.bindings_made == made + 1  # one binding for these buffers, reused by io_binding_for
    # The bound input is the tensor's live memory: change it in place and the result follows, no rebinding.
    convert(cpu_tensor(r, TensorDirection.INPUT, frame(SHAPES["ocr_cls"], seed=5)), ins[0])
    execute(r, ins, outs)
    assert engine.bindings_made == made + 1
    assert not np.array_equal(outs[0].numpy(), first)
    assert r.stats["copies"] == before


def test_other_view_costs_one_counted_copy_per_tensor(cls_hw):
    r = cls_hw
    x = frame(SHAPES["ocr_cls"], seed=6)
    ins, outs = tensors(r, TensorType.HW, x)
    execute(r, ins, outs)
    before = r.stats
    cpu_in = cpu_tensor(r, TensorDirection.INPUT, x)
    cpu_out = cpu_tensor(r, TensorDirection.OUTPUT)
    execute(r, [cpu_in], [cpu_out])
    after = r.stats
    assert after["copies"] - before["copies"] == 2  # input into a BF16 HCWNC4 staging buffer, output out of one
    assert after["bytes_copied"] - before["bytes_copied"] == ins[0].nbytes + cpu_out.nbytes
    np.testing.assert_array_equal(cpu_out.numpy(), as_cpu(r, outs[0]))


def test_run_convenience_on_cpu_views(cls_cpu):
    x = frame(SHAPES["ocr_cls"], seed=7)
    (y,) = cls_cpu.run({"x": x}).values()
    np.testing.assert_array_equal(y, raw_ort("ocr_cls", x))


# ------------------------------------------------------------------------------------------ devices
def test_fallback_report_names_the_cpu_provider_and_why():
    with make("ocr_cls", device="AUTO") as r:
        info = r.device_info
        assert info.attached == "CPU" and info.full_name == CPU_EP
        placement = dict(info.placement)
        assert set(placement) == {CPU_EP} and placement[CPU_EP] > 0
        nodes = sum(len(s.get_nodes()) for s in r.session_for().get_provider_graph_assignment_info())
        assert placement[CPU_EP] == nodes
        skipped = dict(info.skipped)
        assert "Vitis AI execution provider is not installed" in skipped["NPU"]
        assert "GPU" in skipped
    assert VaimlRunner.npu_present() is (VITISAI_EP in ort.get_available_providers())


def test_npu_falls_back_to_cpu_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = make("ocr_cls", device="NPU")
    with r:
        assert any(issubclass(w.category, NpuFallbackWarning) for w in caught)
        assert r.device_info.fell_back and r.device_info.attached == "CPU"
        assert VITISAI_EP in r.device_info.reason and "Ryzen AI" in r.device_info.reason
        assert dict(r.device_info.placement)[CPU_EP] > 0


def test_npu_with_fallback_error_raises_provider_not_installed():
    if VaimlRunner.npu_present():
        pytest.skip("the Vitis AI execution provider is installed here")
    with pytest.raises(NpuError, match="Vitis AI execution provider is not installed"):
        make("ocr_cls", device="NPU", fallback="error")


def test_engine_options_reach_the_session():
    opts = {"intra_op_num_threads": 1, "graph_optimization_level": "basic", "config_file": "vaip_config.json",
            "session.intra_op.allow_spinning": "0"}
    with make("ocr_cls", engine_options=opts, input_tensor_type="CPU", output_tensor_type="CPU") as r:
        so = r.session_for().get_session_options()
        assert so.intra_op_num_threads == 1
        assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert so.get_session_config_entry("session.record_ep_graph_assignment_info") == "1"
        assert r._vitis_options == {"config_file": "vaip_config.json"}  # Vitis AI EP options, unused on CPU
    with pytest.raises(ValueError, match="graph_optimization_level"):
        make("ocr_cls", engine_options={"graph_optimization_level": "fastest"})


def test_optimized_model_cache_is_reused(tmp_path):
    x = frame(SHAPES["ocr_cls"], seed=8)
    with make("ocr_cls", cache_dir=tmp_path, input_tensor_type="CPU", output_tensor_type="CPU") as first:
        (cached,) = tmp_path.glob("vaiml-*.onnx")
        assert first.session_for()._model_path is None  # built from the edited model's bytes
        y1 = first.run({"x": x})
    with make("ocr_cls", cache_dir=tmp_path, input_tensor_type="CPU", output_tensor_type="CPU") as second:
        assert second.session_for()._model_path == str(cached)
        assert second.session_for().get_session_options().graph_optimization_level == \
            ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        y2 = second.run({"x": x})
    np.testing.assert_array_equal(next(iter(y1.values())), next(iter(y2.values())))
    assert len(list(tmp_path.glob("*.onnx"))) == 1


# ------------------------------------------------------------------------------------------ shapes
def test_shapes_option_and_one_session_per_signature():
    with make("ocr_rec", input_tensor_type="CPU", output_tensor_type="CPU") as r:
        assert r.input_specs[0].shape == (None, 3, None, None)
        assert r.stats["compiles"] == 1
        out_info = r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0]
        assert out_info.shape == (1, 40, 6625)  # static, from ONNX Runtime's shape inference
        narrow = (1, 3, 48, 160)
        for seed in (9, 10):
            x = frame(narrow, seed=seed)
            ins = [NpuTensor(r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0].replace(shape=narrow), x)]
            y = np.zeros((1, 20, 6625), np.float32)
            outs = [NpuTensor(out_info.replace(shape=y.shape), y)]
            execute(r, ins, outs)
            np.testing.assert_array_equal(y, raw_ort("ocr_rec", x))
        assert r.stats["compiles"] == 2  # the second call reused the 160-wide session
        assert len(r._engines) == 2


def test_dynamic_model_without_shapes_is_refused():
    with pytest.raises(ValueError, match="shapes"):
        RunnerFactory.create_runner(RunnerType.VAIML, model_or_skip("ocr_rec"), {"device": "CPU"})


def test_stateful_silero_vad_on_cpu_views():
    path = model_or_skip("silero_vad")
    raw = ort.InferenceSession(str(path), providers=[CPU_EP])
    opts = {"device": "CPU", "input_tensor_type": "CPU", "output_tensor_type": "CPU",
            "shapes": {"input": [1, 512], "state": [2, 1, 128]}}
    with RunnerFactory.create_runner(RunnerType.VAIML, path, opts) as r:
        specs = {s.name: s.shape for s in r.input_specs}
        assert specs == {"input": (None, None), "state": (2, None, 128), "sr": ()}
        infos = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)
        ins = [NpuTensor(i, np.zeros(i.shape, i.numpy_dtype)) for i in infos]
        outs = [NpuTensor(i, np.zeros(i.shape, i.numpy_dtype))
                for i in r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)]
        ins[2].numpy()[...] = 16000
        state = np.zeros((2, 1, 128), np.float32)
        rng = np.random.default_rng(11)
        for _ in range(4):  # state carried from one chunk to the next
            chunk = (rng.standard_normal((1, 512)) * 0.1).astype(np.float32)
            prob, state_ref = raw.run(None, {"input": chunk, "state": state, "sr": np.array(16000, np.int64)})
            ins[0].numpy()[...] = chunk
            ins[1].numpy()[...] = state
            execute(r, ins, outs)
            np.testing.assert_array_equal(outs[0].numpy(), prob)
            np.testing.assert_array_equal(outs[1].numpy(), state_ref)
            state = state_ref
        assert r.stats["copies"] == 0


# ------------------------------------------------------------------------------------------ concurrency
def test_eight_threads_share_one_runner(cls_hw):
    r = cls_hw
    frames = [frame(SHAPES["ocr_cls"], seed=20 + k) for k in range(8)]
    expected = []
    for x in frames:
        ins, outs = tensors(r, TensorType.HW, x)
        execute(r, ins, outs)
        expected.append(outs[0].numpy().copy())
    results: dict[int, list[np.ndarray]] = {}
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        ins, outs = tensors(r, TensorType.HW, frames[k])
        barrier.wait()
        got = []
        for _ in range(5):
            status = r.execute([ins], [outs])
            if status is not StatusCode.SUCCESS:
                errors.append(r.last_error)
            got.append(outs[0].numpy().copy())
        results[k] = got

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(8):
        for y in results[k]:
            np.testing.assert_array_equal(y, expected[k])


@pytest.mark.parametrize("order", ["submission", "completion"])
def test_execute_async_with_callbacks(order):
    with make("ocr_cls", input_tensor_type="CPU", output_tensor_type="CPU", callback_order=order,
              max_concurrent_runs=3) as r:
        frames = [frame(SHAPES["ocr_cls"], seed=40 + k) for k in range(6)]
        sets = [tensors(r, TensorType.CPU, x) for x in frames]
        seen: list[tuple[int, StatusCode]] = []
        done = threading.Event()

        def callback(handle) -> None:
            seen.append((handle.job_id, handle.status))
            if len(seen) == len(sets):
                done.set()

        ids = []
        for ins, outs in sets:
            while True:
                job = r.execute_async([ins], [outs], callback)
                if job.status is not StatusCode.RESOURCE_UNAVAILABLE:
                    break
                threading.Event().wait(0.002)  # all runs busy: transient, retry
            assert job.status is StatusCode.SUCCESS, r.last_error
            ids.append(job.job_id)
        assert done.wait(60)
        assert all(s is StatusCode.SUCCESS for _, s in seen)
        assert sorted(j for j, _ in seen) == ids
        if order == "submission":
            assert [j for j, _ in seen] == ids
        for x, (_, outs) in zip(frames, sets):
            np.testing.assert_array_equal(outs[0].numpy(), raw_ort("ocr_cls", x))
        assert r.stats["jobs_completed"] == len(sets)


def test_wait_on_async_job(cls_cpu):
    r = cls_cpu
    x = frame(SHAPES["ocr_cls"], seed=50)
    ins, outs = tensors(r, TensorType.CPU, x)
    job = r.execute_async([ins], [outs])
    assert job.status is StatusCode.SUCCESS and job.job_id >= 1
    assert r.wait(job, 60_000) is StatusCode.SUCCESS
    assert r.wait(job, 0) is StatusCode.INVALID_JOB_ID  # collected
    np.testing.assert_array_equal(outs[0].numpy(), raw_ort("ocr_cls", x))


def test_closed_runner_fails_execution():
    r = make("ocr_cls", input_tensor_type="CPU", output_tensor_type="CPU")
    ins, outs = tensors(r, TensorType.CPU, frame(SHAPES["ocr_cls"]))
    r.close()
    assert r.execute([ins], [outs]) is StatusCode.FAILURE
    assert r._engines == []


@pytest.mark.parametrize(("shape", "perm"), [
    ((48, 1, 192, 1, 4), (3, 1, 4, 0, 2)), ((1, 1, 4, 48, 192), (3, 1, 4, 0, 2)), ((2, 3, 4, 5, 6), (3, 1, 4, 0, 2)),
    ((1, 3, 5, 6), (0, 2, 3, 1)), ((2, 1, 3, 1), (3, 2, 1, 0))])
def test_reduced_transpose_moves_the_same_data(shape, perm):
    from npurt.backends.vaiml import _reduce_transpose
    a = np.arange(int(np.prod(shape))).reshape(shape)
    reduced, rperm = _reduce_transpose(shape, perm)
    assert len(reduced) <= len(shape)
    np.testing.assert_array_equal(a.reshape(reduced).transpose(rperm).ravel(), a.transpose(perm).ravel())


def _qdq_model(path) -> None:
    """x (float) -> Q -> DQ -> Relu -> Q -> DQ -> y: both ends are QDQ boundaries (uint8, scale 0.05, zp 10)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(10, np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
             helper.make_node("Relu", ["xf"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), str(path))


def test_qdq_boundaries_are_the_quantized_tensors(tmp_path):
    path = tmp_path / "qdq.onnx"
    _qdq_model(path)
    x = (np.random.default_rng(60).standard_normal((1, 3, 8, 8)) * 3).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=[CPU_EP]).run(None, {"x": x})[0]
    with RunnerFactory.create_runner(RunnerType.VAIML, path, {"device": "CPU"}) as r:
        q = r.get_quant_parameters("x")
        assert (q.scale, q.zero_point) == (pytest.approx(0.05), 10)
        hw_in = r.get_tensor_info_by_name("x", TensorType.HW)
        assert hw_in.data_type is DataType.UINT8 and hw_in.shape == (1, 3, 8, 8)
        session = r.session_for()  # the boundary Q / DQ are gone: the session takes and gives uint8
        assert [i.type for i in session.get_inputs()] == ["tensor(uint8)"]
        assert [o.type for o in session.get_outputs()] == ["tensor(uint8)"]
        ins, outs = tensors(r, TensorType.HW)
        convert(cpu_tensor(r, TensorDirection.INPUT, x), ins[0], quant=q)
        execute(r, ins, outs)
        assert r.stats["copies"] == 0
        y = cpu_tensor(r, TensorDirection.OUTPUT)
        convert(outs[0], y, quant=r.get_quant_parameters("y"))
        np.testing.assert_allclose(y.numpy(), ref, atol=1e-6)
        cpu_out = cpu_tensor(r, TensorDirection.OUTPUT)
        execute(r, [cpu_tensor(r, TensorDirection.INPUT, x)], [cpu_out])
        np.testing.assert_allclose(cpu_out.numpy(), ref, atol=1e-6)
