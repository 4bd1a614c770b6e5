"""com.microsoft GatherBlockQuantized in standard operators (block_gather): the builder's int4 tied embedding, for
OpenVINO's frontend, which does not convert it. The rewrite gives ONNX Runtime's own kernel's rows exactly, on ONNX
Runtime and on OpenVINO, with and without zero points; other settings are refused naming them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import TensorProto, helper, numpy_helper

from npurt import block_gather

ROWS, WIDTH, BLOCK = 50, 64, 16


def _model(zero_points: bool, **attrs: int) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (ROWS, WIDTH // 2), dtype=np.uint8)  # two 4-bit values a byte
    scales = rng.uniform(0.01, 0.1, (ROWS, WIDTH // BLOCK)).astype(np.float32)
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    inputs = ["data", "ids", "scales"]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (ROWS, WIDTH // BLOCK // 2), dtype=np.uint8),
                                             "zeros"))
        inputs.append("zeros")
    node = helper.make_node("GatherBlockQuantized", inputs, ["rows"], domain="com.microsoft", name="embed",
                            **{"bits": 4, "block_size": BLOCK, "gather_axis": 0, "quantize_axis": 1, **attrs})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "s"])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, "s", WIDTH])], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@pytest.mark.parametrize("zero_points", [False, True])
def test_the_rewrite_gives_onnx_runtime_s_rows_on_both_engines(zero_points):
    model = _model(zero_points)
    ids = np.array([[0, 7, 49, 7, 23]], np.int64)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                   {"ids": ids})[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert block_gather.rewrite(rewritten) == 1
    assert not any(n.domain == "com.microsoft" for n in rewritten.graph.node)
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                      {"ids": ids})[0]
    np.testing.assert_array_equal(got, want)
    compiled = ov.Core().compile_model(ov.Core().read_model(rewritten.SerializeToString()), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_array_equal(compiled({"ids": ids})[0], want)


@pytest.mark.parametrize(("attrs", "named"), [({"bits": 8}, "bits=8"), ({"gather_axis": 1}, "gather_axis=1")])
def test_other_settings_are_refused_by_name(attrs, named):
    with pytest.raises(ValueError, match=f"GatherBlockQuantized 'embed' with .*{named}"):
        block_gather.rewrite(_model(False, **attrs))
