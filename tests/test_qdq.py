"""QDQ boundaries: detection and removal, on the PP-OCR classifier quantized here with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npurt import DataType, MemoryLayout, NpuTensor, NpuTensorInfo, QuantParameters, TensorDirection, TensorType
from npurt import convert as npu_convert
from npurt.qdq import annotate_specs, find_boundaries, quantized_hw_ports, strip_boundaries
from npurt.runner import Port, PortSpec
from tests.helpers.models import cache_dir, model_or_skip

SHAPE = (1, 3, 48, 192)


def _quantized_classifier() -> str:
    """The classifier with a static [1,3,48,192] input, quantized (QDQ, uint8 activations); cached."""
    target = cache_dir() / "ch_ppocr_mobile_v2.0_cls_48x192_qdq_u8.onnx"
    if target.exists():
        return str(target)
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = onnx.load(model_or_skip("ocr_cls"))
    for value, dims in ((model.graph.input[0], SHAPE), (model.graph.output[0], (1, 2))):
        for dim, size in zip(value.type.tensor_type.shape.dim, dims):
            dim.Clear()
            dim.dim_value = size
    static = target.with_suffix(".static.onnx")
    onnx.save(model, static)

    class Frames(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.frames = iter([{"x": rng.random(SHAPE, np.float32) * 2 - 1} for _ in range(3)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.frames, None)

    partial = target.with_suffix(".part")
    quantize_static(str(static), str(partial), Frames(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    static.unlink()
    partial.replace(target)  # atomic: parallel test processes never see half a model
    return str(target)


@pytest.fixture(scope="module")
def qdq_model() -> onnx.ModelProto:
    return onnx.load(_quantized_classifier())


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _tensor(arr: np.ndarray, dtype: DataType) -> NpuTensor:
    info = NpuTensorInfo(name="t", data_type=dtype, shape=arr.shape, tensor_type=TensorType.CPU,
                         memory_layout=MemoryLayout.NCHW if arr.ndim == 4 else MemoryLayout.UNKNOWN)
    return NpuTensor(info, arr)


def _requantize(x: np.ndarray, to: DataType, quant: QuantParameters) -> np.ndarray:
    out = np.empty(x.shape, to.numpy)
    npu_convert(_tensor(x, DataType.from_numpy(x.dtype)), _tensor(out, to), quant=quant)
    return out


def test_classifier_boundaries_found(qdq_model: onnx.ModelProto) -> None:
    found = find_boundaries(qdq_model)
    out_name = qdq_model.graph.output[0].name
    assert set(found) == {"x", out_name}
    x, y = found["x"], found[out_name]
    assert x.direction is TensorDirection.INPUT and y.direction is TensorDirection.OUTPUT
    assert x.data_type is DataType.UINT8 and y.data_type is DataType.UINT8
    assert x.quant.scale > 0 and 0 <= x.quant.zero_point <= 255
    # the values are the model's own constants
    inits = {i.name: numpy_helper.to_array(i) for i in qdq_model.graph.initializer}
    q_node = next(n for n in qdq_model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    assert np.float32(x.quant.scale) == inits[q_node.input[1]]
    assert x.quant.zero_point == int(inits[q_node.input[2]])


def test_stripped_classifier_matches_qdq_model(qdq_model: onnx.ModelProto) -> None:
    found = find_boundaries(qdq_model)
    out_name = qdq_model.graph.output[0].name
    stripped = strip_boundaries(qdq_model, ["x", out_name])
    onnx.checker.check_model(stripped)
    assert [i.name for i in stripped.graph.input] == ["x"]
    assert [o.name for o in stripped.graph.output] == [out_name]
    assert stripped.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8
    assert stripped.graph.output[0].type.tensor_type.elem_type == TensorProto.UINT8
    assert len(stripped.graph.node) < len(qdq_model.graph.node)
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in stripped.graph.node)
    assert len(qdq_model.graph.node) == len(onnx.load(_quantized_classifier()).graph.node)  # input not modified

    rng = np.random.default_rng(1)
    x = rng.random(SHAPE, np.float32) * 2.4 - 1.2  # a little outside the calibrated range: saturation too
    reference = _session(qdq_model).run(None, {"x": x})[0]
    xq = _requantize(x, DataType.UINT8, found["x"].quant)

    # The kernel quantizes exactly like ONNX Runtime's QuantizeLinear.
    q_only = helper.make_model(helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, SHAPE)],
        [numpy_helper.from_array(np.array(found["x"].quant.scale, np.float32), "s"),
         numpy_helper.from_array(np.array(found["x"].quant.zero_point, np.uint8), "z")]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    np.testing.assert_array_equal(xq, _session(q_only).run(None, {"x": x})[0])

    yq = _session(stripped).run(None, {"x": xq})[0]
    assert yq.dtype == np.uint8
    y = _requantize(yq, DataType.FLOAT32, found[out_name].quant)
    step = found[out_name].quant.scale
    assert np.max(np.abs(y - reference)) <= step * 1.001, (y, reference)
    np.testing.assert_array_equal(y, reference)  # in fact exact: same quantize, same integer graph


def _qdq_graph(scale: onnx.TensorProto | None = None, zp_type: int = TensorProto.INT8, extra_user: bool = False,
               scale_node: bool = False, per_axis: bool = False) -> onnx.ModelProto:
    """x -> Q -> DQ -> Relu -> Q -> DQ -> y, with knobs that make the boundaries invalid."""
    zp_np = np.int8 if zp_type == TensorProto.INT8 else np.uint8
    inits = [numpy_helper.from_array(np.array(3, zp_np), "zp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "s2")]
    nodes = []
    if scale_node:
        nodes.append(helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(0.05, np.float32))))
    elif per_axis:
        inits.append(numpy_helper.from_array(np.array([0.05, 0.1], np.float32), "s"))
    else:
        inits.append(scale or numpy_helper.from_array(np.array(0.05, np.float32), "s"))
    nodes += [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"] if not per_axis else ["x", "s"], ["xq"], axis=1),
        helper.make_node("DequantizeLinear", ["xq", "s", "zp"] if not per_axis else ["xq", "s"], ["xd"], axis=1),
        helper.make_node("Relu", ["xd"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s2", "zp"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "s2", "zp"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4])]
    if extra_user:
        nodes.append(helper.make_node("Neg", ["x"], ["nx"]))
        outputs.append(helper.make_tensor_value_info("nx", TensorProto.FLOAT, [1, 2, 4]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)


def test_small_graph_boundaries_and_strip() -> None:
    model = _qdq_graph()
    found = find_boundaries(model)
    assert set(found) == {"x", "y"}
    assert found["x"].quant == QuantParameters(np.float32(0.05).item(), 3) and found["x"].data_type is DataType.INT8
    assert found["y"].quant == QuantParameters(np.float32(0.02).item(), 3)
    stripped = strip_boundaries(model, ["x", "y"])
    onnx.checker.check_model(stripped)
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(1, 2, 4)
    expected = _session(model).run(None, {"x": x})[0]
    xq = np.clip(np.rint(x / np.float32(0.05)) + 3, -128, 127).astype(np.int8)
    yq = _session(stripped).run(None, {"x": xq})[0]
    assert yq.dtype == np.int8
    np.testing.assert_array_equal((yq.astype(np.float32) - 3) * np.float32(0.02), expected)
    # Only one side stripped: the other keeps its float type and its Q/DQ node.
    only_in = strip_boundaries(model, ["x"])
    assert only_in.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    np.testing.assert_array_equal(_session(only_in).run(None, {"x": xq})[0], expected)


def test_constant_node_scale_and_uint8_zero_point() -> None:
    found = find_boundaries(_qdq_graph(scale_node=True, zp_type=TensorProto.UINT8))
    assert found["x"].quant.scale == np.float32(0.05).item() and found["x"].data_type is DataType.UINT8
    stripped = strip_boundaries(_qdq_graph(scale_node=True), ["x"])
    onnx.checker.check_model(stripped)
    assert [n.op_type for n in stripped.graph.node][:2] == ["Constant", "DequantizeLinear"]  # DQ still reads s
    stripped = strip_boundaries(_qdq_graph(), ["y"])
    assert "s2" in {i.name for i in stripped.graph.initializer}  # the Q before the removed DQ still reads it


def test_not_boundaries() -> None:
    assert "x" not in find_boundaries(_qdq_graph(extra_user=True))  # x also feeds a Neg
    assert "x" not in find_boundaries(_qdq_graph(per_axis=True))  # per-channel scale
    model = _qdq_graph()
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "s"))
    model.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, []))
    assert "x" not in find_boundaries(model)  # scale is a runtime input, not a constant
    with pytest.raises(ValueError, match="not QDQ boundaries"):
        strip_boundaries(_qdq_graph(extra_user=True), ["x"])
    with pytest.raises(ValueError, match="nope"):
        strip_boundaries(_qdq_graph(), ["nope"])


def test_backend_helpers() -> None:
    found = find_boundaries(_qdq_graph())
    specs = [PortSpec("x", DataType.FLOAT32, (1, 2, 4)), PortSpec("other", DataType.FLOAT32, (3,))]
    x, other = annotate_specs(specs, found)
    assert (x.quant, x.quant_data_type) == (found["x"].quant, DataType.INT8)
    assert other == specs[1]
    cpu = NpuTensorInfo(name="x", data_type=DataType.FLOAT32, shape=(1, 2, 4), tensor_type=TensorType.CPU)
    hw = cpu.replace(tensor_type=TensorType.HW, data_type=DataType.INT8)
    ports = [Port(cpu, hw, TensorType.HW, x.quant), Port(cpu.replace(name="c"), hw.replace(name="c"), TensorType.CPU,
                                                         x.quant), Port(cpu.replace(name="f"), hw, TensorType.HW)]
    assert quantized_hw_ports(ports) == ["x"]


# -- the backends: a QDQ boundary's HW view is the quantized tensor ---------------------------------------
# the boundaries' quantization per code type: (input scale, zero point), (output scale, zero point), the opset
SMALL_QDQ = {DataType.UINT8: ((0.02, 128), (0.01, 0), 17),
             DataType.UINT16: ((0.0002, 32768), (0.0001, 0), 21)}  # uint16 Q/DQ: opset 21 (A16W8, the HTP's)


def _small_qdq_model(path, dtype: DataType = DataType.UINT8) -> str:
    """x -> Q -> DQ -> Relu -> Q -> DQ -> y, the same code type at both boundaries (OpenVINO 2026.4's CPU plugin
    fails to compile the quantized PP-OCR classifier itself: its low-precision AddTransformation throws on the
    conv-bias Add, with or without npurt)."""
    (s_in, z_in), (s_out, z_out), opset = SMALL_QDQ[dtype]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    inits = [numpy_helper.from_array(np.array(s_in, np.float32), "s_in"),
             numpy_helper.from_array(np.array(z_in, dtype.numpy), "z_in"),
             numpy_helper.from_array(np.array(s_out, np.float32), "s_out"),
             numpy_helper.from_array(np.array(z_out, dtype.numpy), "z_out")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_in", "z_in"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_in", "z_in"], ["xd"]),
             helper.make_node("Relu", ["xd"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s_out", "z_out"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "s_out", "z_out"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], inits), ir_version=10,
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, path)
    return str(path)


@pytest.mark.parametrize("dtype", [DataType.UINT8, DataType.UINT16])
@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_backend_quantized_boundaries(backend: str, dtype: DataType, tmp_path) -> None:
    from npurt import RunnerFactory, StatusCode

    path = _small_qdq_model(tmp_path / "qdq.onnx", dtype)
    (s_in, z_in), (s_out, z_out), _ = SMALL_QDQ[dtype]
    top = np.iinfo(dtype.numpy).max
    with RunnerFactory.create_runner(backend, path, {"device": "CPU", "hw_view": "npu"}) as r:
        q_in, q_out = r.get_quant_parameters("x"), r.get_quant_parameters("y")
        assert (q_in.scale, q_in.zero_point) == (np.float32(s_in), z_in)
        assert (q_out.scale, q_out.zero_point) == (np.float32(s_out), z_out)
        x_hw, y_hw = r.get_tensor_info_by_name("x"), r.get_tensor_info_by_name("y")
        assert (x_hw.data_type, x_hw.shape) == (dtype, (1, 3, 8, 8))
        assert (y_hw.data_type, y_hw.shape) == (dtype, (1, 3, 8, 8))
        x, y = r.allocate_npu_tensor(x_hw), r.allocate_npu_tensor(y_hw)
        codes = np.linspace(z_in - 0.45 * top, z_in + 0.45 * top, 192)  # both sides of the zero point
        x.numpy()[...] = codes.astype(dtype.numpy).reshape(1, 3, 8, 8)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS, r.last_error
        assert r.stats["copies"] == 0  # the quantized tensors go to the engine as they are
        expected = np.clip(np.rint(np.maximum((x.numpy().astype(np.float32) - z_in) * np.float32(s_in), 0)
                                   / np.float32(s_out)) + z_out, 0, top)
        assert np.abs(y.numpy().astype(int) - expected.astype(int)).max() <= 1
        # a float frame in the CPU view is quantized by the runner: one counted copy in, one out
        frame = (x.numpy().astype(np.float32) - z_in) * np.float32(s_in)
        got = r.run({"x": frame})["y"]
        np.testing.assert_allclose(got, np.maximum(frame, 0), atol=1.1 * s_out)
        assert r.stats["copies"] == 2


def test_the_kernels_quantize_uint16_as_onnx_runtime() -> None:
    """float32 -> uint16 and back (A16W8 boundaries): bit for bit ONNX Runtime's QuantizeLinear and DequantizeLinear
    (opset 21), saturation included."""
    scale, zero = np.float32(0.00031), np.uint16(30_001)
    x = np.concatenate([np.random.default_rng(4).uniform(-12, 12, 4093).astype(np.float32),
                        np.array([0.0, -0.0, 1e9, -1e9, np.inf, -np.inf], np.float32)]).reshape(1, 1, -1)
    shape = list(x.shape)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])], "q16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("q", TensorProto.UINT16, shape),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.array(scale), "s"), numpy_helper.from_array(np.array(zero), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    q_ort, d_ort = _session(model).run(None, {"x": x})
    quant = QuantParameters(float(scale), int(zero))
    q = _requantize(x, DataType.UINT16, quant)
    np.testing.assert_array_equal(q, q_ort)
    assert q.max() == 65535 and q.min() == 0
    np.testing.assert_array_equal(_requantize(q, DataType.FLOAT32, quant), d_ort)


def test_vaiml_backend_on_the_quantized_classifier() -> None:
    """The real quantized PP-OCR classifier through VAIML: quantized HW views, result as ONNX Runtime's."""
    from npurt import RunnerFactory, StatusCode

    path = _quantized_classifier()
    model = onnx.load(path)
    found = find_boundaries(model)
    out_name = model.graph.output[0].name
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "hw_view": "npu"}) as r:
        assert r.get_quant_parameters("x") == found["x"].quant
        x_hw, y_hw = r.get_tensor_info_by_name("x"), r.get_tensor_info_by_name(out_name)
        assert (x_hw.data_type, x_hw.shape) == (DataType.UINT8, SHAPE)
        frame = np.random.default_rng(3).random(SHAPE, np.float32) * 2 - 1
        x, y = r.allocate_npu_tensor(x_hw), r.allocate_npu_tensor(y_hw)
        x.numpy()[...] = _requantize(frame, DataType.UINT8, found["x"].quant)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS, r.last_error
        assert r.stats["copies"] == 0
        (ref,) = _session(strip_boundaries(model, ["x", out_name])).run(None, {"x": x.numpy()})
        np.testing.assert_array_equal(y.numpy(), ref)


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_a_dequantize_without_zero_point_takes_its_inputs_type(backend: str, tmp_path) -> None:
    """Symmetric int8 (opset 21: QuantizeLinear output_dtype INT8, no zero points anywhere): the output boundary's
    HW view is int8, as the DequantizeLinear's input is (it was taken for uint8: ONNX Runtime refused the model,
    OpenVINO returned [0, 0.5, 0, 0] for [-1, 0.5, 0, -6] as SUCCESS, every negative value lost)."""
    from npurt import RunnerFactory

    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["xq"], output_dtype=TensorProto.INT8),
             helper.make_node("DequantizeLinear", ["xq", "s"], ["xd"]),
             helper.make_node("Neg", ["xd"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s"], ["rq"], output_dtype=TensorProto.INT8),
             helper.make_node("DequantizeLinear", ["rq", "s"], ["y"])]
    graph = helper.make_graph(nodes, "sym", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path = tmp_path / "sym.onnx"
    onnx.save(model, path)
    assert {b.name: b.data_type for b in find_boundaries(model).values()} == {"x": DataType.INT8, "y": DataType.INT8}
    x = np.array([[1.0, -0.5, 0.0, 6.0]], np.float32)
    (want,) = _session(model).run(None, {"x": x})
    with RunnerFactory.create_runner(backend, path, {"device": "CPU", "hw_view": "npu"}) as r:
        assert r.get_tensor_info_by_name("y").data_type is DataType.INT8
        np.testing.assert_array_equal(r.run({"x": x})["y"], want)


@pytest.mark.parametrize("fmt, quantized, atol", [
    ({"data_type": "FP16"}, False, 1e-3),  # another data type: the boundary stays in the model, the view is FP16
    ({"data_type": "BF16", "memory_layout": "NCHW"}, False, 0.03),
    ({"memory_layout": "NHWC"}, True, 0.0),  # the quantized tensor in another layout
    ({"memory_layout": "HCWNC4"}, True, 0.0)])
@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_hw_format_on_a_qdq_boundary(backend: str, fmt: dict, quantized: bool, atol: float, tmp_path) -> None:
    """hw_format on both QDQ boundaries of a model: a data type gives that float view of the float tensor (the
    quantized view stayed: OpenVINO fed FP16 values to the stripped uint8 input, or returned uint8 codes as FP16,
    as SUCCESS, 99.0 off; ONNX Runtime failed in execute); a layout lays the quantized tensor out so (ONNX Runtime
    was handed NHWC codes for its NCHW input)."""
    from npurt import NpuUnsupportedError, RunnerFactory

    path = _small_qdq_model(tmp_path / "qdq.onnx", DataType.UINT8)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)
    (want,) = _session(onnx.load(path)).run(None, {"x": x})
    options = {"device": "CPU", "hw_view": "npu", "hw_format": {"x": fmt, "y": fmt}}
    if backend == "OPENVINO" and fmt.get("memory_layout") == "HCWNC4":
        with pytest.raises(NpuUnsupportedError, match="groups channels"):
            RunnerFactory.create_runner(backend, path, options)
        return
    with RunnerFactory.create_runner(backend, path, options) as r:
        for name in ("x", "y"):
            info = r.get_tensor_info_by_name(name)
            assert (r.get_quant_parameters(name) is not None) == quantized
            assert info.data_type is (DataType.UINT8 if quantized else DataType[fmt["data_type"]])
            assert info.memory_layout.name == fmt.get("memory_layout", info.memory_layout.name)
        np.testing.assert_allclose(r.run({"x": x})["y"], want, atol=atol, rtol=0)
