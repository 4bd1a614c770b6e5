"""What only the VAIML backend has: ONNX Runtime session options and threads, its optimized-model cache, the NPU's
views built into the ONNX graph. The behaviour both backends share is in test_backends.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npurt import NpuError, NpuTensor, RunnerFactory, StatusCode, TensorDirection, TensorType, convert
from npurt.backends.onnxruntime import CPU_EP
from npurt.onnx_edit import _reduce_transpose
from tests.helpers.models import model_or_skip
from tests.helpers.ocr import SHAPES, frame


def make(model: str = "ocr_cls", **options):
    opts = {"device": "CPU"}
    opts.update(options)
    return RunnerFactory.create_runner("VAIML", model_or_skip(model), opts)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even) -> float32."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def test_the_session_loads_the_model_file_itself():
    """Device views on CPU: no graph edits, the session is the one InferenceSession(path) makes."""
    with make() as r:
        session = r.engine_for().session
        assert session._model_path == str(model_or_skip("ocr_cls"))
        placement = dict(r.device_info.placement)
        assert set(placement) == {CPU_EP}
        assert placement[CPU_EP] == sum(len(s.get_nodes()) for s in session.get_provider_graph_assignment_info())


def test_engine_options_and_thread_hints_reach_the_session():
    opts = {"intra_op_num_threads": 1, "graph_optimization_level": "basic", "config_file": "vaip_config.json",
            "session.intra_op.allow_spinning": "0"}
    with make(engine_options=opts) as r:
        so = r.engine_for().session.get_session_options()
        assert so.intra_op_num_threads == 1
        assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert r.backend.ep.options == {"config_file": "vaip_config.json"}  # Vitis AI EP options, unused on CPU
    with make(performance_hint="THROUGHPUT", max_concurrent_runs=2) as r:
        so = r.engine_for().session.get_session_options()
        assert so.intra_op_num_threads >= 1
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert dict(r.device_info.engine_settings)["allow_spinning"] == "0"
    with make(num_threads=1) as r:
        assert r.engine_for().session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(ValueError, match="graph_optimization_level"):
        make(engine_options={"graph_optimization_level": "fastest"})


def test_engine_options_given_as_text_are_read_strictly():
    """The command line's --engine-option gives text: "0" turns a flag off (bool("0") would turn it on), the
    execution mode takes its names or ONNX Runtime's enum (whose member read as sequential before), thread counts
    digits or ints, and what is none of these is a ValueError naming the option; a name that is no session option
    and no config entry (``area.key``), an OpenVINO property say, is refused at open. engine_settings report what
    the sessions run with: an engine option's threads and spinning win over option num_threads and the hint."""
    text = {"enable_cpu_mem_arena": "0", "enable_mem_pattern": "off", "execution_mode": "ORT_PARALLEL",
            "intra_op_num_threads": " 2", "session.intra_op.allow_spinning": "no"}
    with make(num_threads=1, engine_options=text) as r:
        so = r.engine_for().session.get_session_options()
        assert so.enable_cpu_mem_arena is False and so.enable_mem_pattern is False
        assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL and so.intra_op_num_threads == 2
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"  # ONNX Runtime's spelling
        settings = dict(r.device_info.engine_settings)
        assert settings["intra_op_num_threads"] == "2" and settings["allow_spinning"] == "0"
        assert settings["enable_cpu_mem_arena"] == "False" and settings["execution_mode"] == "ORT_PARALLEL"
    typed = {"enable_mem_reuse": False, "execution_mode": ort.ExecutionMode.ORT_PARALLEL,
             "inter_op_num_threads": np.int64(2)}
    with make(engine_options=typed) as r:
        so = r.engine_for().session.get_session_options()
        assert so.enable_mem_reuse is False and so.execution_mode == ort.ExecutionMode.ORT_PARALLEL
        assert so.inter_op_num_threads == 2
    for bad, named in (({"enable_cpu_mem_arena": "maybe"}, "enable_cpu_mem_arena"),
                       ({"execution_mode": "paralel"}, "execution_mode"),
                       ({"intra_op_num_threads": "two"}, "intra_op_num_threads"),
                       ({"inter_op_num_threads": -1}, "inter_op_num_threads"),
                       ({"intra_op_num_threads": True}, "intra_op_num_threads")):
        with pytest.raises(ValueError, match=named):
            make(engine_options=bad)
    with pytest.raises(NpuError, match="no session option 'ENABLE_CPU_PINNING'"):
        make(engine_options={"ENABLE_CPU_PINNING": "NO"})


def test_optimized_model_cache_is_reused(tmp_path):
    """npurt's cache keeps ONNX Runtime's optimized model; a later runner loads it with optimizations off, with the
    same results bit for bit."""
    x = frame(SHAPES["ocr_cls"], seed=8)
    with make(cache_dir=tmp_path) as first:
        assert first.device_info.load_steps[-1][0] == "compiled and stored in the cache"
        y1 = first.run({"x": x})
    (blob,) = tmp_path.rglob("blob")
    with make(cache_dir=tmp_path) as second:
        assert second.device_info.load_steps[-1][0] == "loaded from the cache"
        session = second.engine_for().session
        assert session._model_path == str(blob)  # the optimized model, as the cache keeps it, read by ONNX Runtime
        assert session.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        y2 = second.run({"x": x})
    np.testing.assert_array_equal(next(iter(y1.values())), next(iter(y2.values())))
    raw = ort.InferenceSession(str(model_or_skip("ocr_cls")), providers=[CPU_EP]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(next(iter(y2.values())), raw)


def test_npu_view_output_with_a_cpu_input_goes_through_the_opset_conversion():
    """A CPU input and a BF16 HW output: the model (opset 11) is converted to opset 13 for the BF16 Cast."""
    x = frame(SHAPES["ocr_cls"], seed=3)
    assert {o.domain: o.version for o in onnx.load(str(model_or_skip("ocr_cls"))).opset_import}[""] == 11
    with make(hw_view="npu", input_tensor_type="CPU", shapes={"x": list(SHAPES["ocr_cls"])}) as r:
        ins = [NpuTensor(r.get_tensor_info_by_name("x", TensorType.CPU), x)]
        outs = [r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.HW)[0])]
        assert r.execute([ins], [outs]) is StatusCode.SUCCESS, r.last_error
        got = np.zeros((1, 2), np.float32)
        convert(outs[0], NpuTensor(r.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0], got))
        ref = ort.InferenceSession(str(model_or_skip("ocr_cls")), providers=[CPU_EP]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, bf16_round(ref))


@pytest.mark.parametrize(("shape", "perm"), [
    ((48, 1, 192, 1, 4), (3, 1, 4, 0, 2)), ((1, 1, 4, 48, 192), (3, 1, 4, 0, 2)), ((2, 3, 4, 5, 6), (3, 1, 4, 0, 2)),
    ((1, 3, 5, 6), (0, 2, 3, 1)), ((2, 1, 3, 1), (3, 2, 1, 0))])
def test_reduced_transpose_moves_the_same_data(shape, perm):
    a = np.arange(int(np.prod(shape))).reshape(shape)
    reduced, rperm = _reduce_transpose(shape, perm)
    assert len(reduced) <= len(shape)
    np.testing.assert_array_equal(a.reshape(reduced).transpose(rperm).ravel(), a.transpose(perm).ravel())


def test_new_tensors_over_memory_bound_before_reuse_the_binding():
    """IOBindings are kept by the addresses they bind: new NpuTensor objects over the same memory (an app that
    wraps its buffers per call) reuse one; other memory gets its own, and every result is the engine's."""
    with make("ocr_cls", shapes={"x": list(SHAPES["ocr_cls"])}) as r:
        x_info = r.get_tensor_info_by_name("x", TensorType.CPU)
        y_info = r.get_tensor_info_by_name(r.get_tensors_info(TensorDirection.OUTPUT)[0].name, TensorType.CPU)
        y_info = y_info.replace(shape=tuple(abs(d) for d in y_info.shape))  # (ONNX Runtime leaves its batch open)
        session = ort.InferenceSession(str(model_or_skip("ocr_cls")), providers=[CPU_EP])
        xs = [frame(SHAPES["ocr_cls"], seed=s) for s in range(3)]
        y = np.zeros(y_info.shape, np.float32)
        engine = r.engine_for()
        before = engine.bindings_made
        for _ in range(3):
            for x in xs:
                assert r.execute([[NpuTensor(x_info, x)]], [[NpuTensor(y_info, y)]]) is StatusCode.SUCCESS
                np.testing.assert_array_equal(y, session.run(None, {"x": x})[0])
        assert engine.bindings_made - before == 3  # one per input buffer, not one per call
        assert r.stats["copies"] == 0


def test_an_opset_conversion_is_never_served_for_another_model() -> None:
    """The opset-13 conversion (for BF16 views in an opset 11/12 model) is kept per model object: a model loaded
    where a converted one was freed (CPython gives it the same id) gets its own conversion (it got the freed model's:
    a runner over model b ran model a's weights, SUCCESS)."""
    from onnx import TensorProto, helper, numpy_helper

    from npurt.onnx_edit import converted_to_opset13, opset

    def opset11(weight: float) -> bytes:
        w = numpy_helper.from_array(np.full((1, 3, 1, 1), weight, np.float32), "w")
        graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])], [w])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6).SerializeToString()

    a, b = opset11(2.0), opset11(3.0)
    for _ in range(20):
        model = onnx.ModelProto()
        model.ParseFromString(a)
        converted_to_opset13(model)
        del model
        model = onnx.ModelProto()
        model.ParseFromString(b)
        converted = converted_to_opset13(model)
        assert numpy_helper.to_array(converted.graph.initializer[0]).ravel()[0] == 3.0
        assert opset(converted) == 13
