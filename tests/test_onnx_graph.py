"""npurt.onnx_graph: a model's graph read without its weights, and the output dims it decides from pinned inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npurt import onnx_graph


def small_net(path, opset: int = 11, external: bool = False):
    """x [N, 64] -> MatMul by a 64x256 weight (an initializer), a Constant node's 256-float bias, then a Reshape to
    [N, 16, 16] whose target comes from Shape -> Slice -> Concat (shape arithmetic), and NonZero (data-dependent)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    bias = rng.standard_normal(256).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([16, 16], np.int64), "tail")]
    nodes = [helper.make_node("Constant", [], ["bias"], value=numpy_helper.from_array(bias)),
             helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["y"]),
             helper.make_node("Shape", ["y"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
             helper.make_node("Concat", ["batch", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["out"]),
             helper.make_node("NonZero", ["x"], ["nz"])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("nz", TensorProto.INT64, None)]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                  size_threshold=1024)
    else:
        onnx.save(model, str(path))
    return w, bias


def test_skeleton_leaves_the_weights_out_and_says_where_they_lie(tmp_path):
    path = tmp_path / "net.onnx"
    w, bias = small_net(path)
    skeleton = onnx_graph.read_skeleton(path)
    assert set(skeleton.weights) == {"w", "bias"}  # the small int64 initializers stay: shape arithmetic reads them
    assert {i.name for i in skeleton.model.graph.initializer} == {"zero", "one", "tail"}
    assert "Constant" not in {n.op_type for n in skeleton.model.graph.node}
    assert skeleton.model.ByteSize() <= path.stat().st_size - w.nbytes - bias.nbytes
    data = path.read_bytes()
    for name, array in (("w", w), ("bias", bias)):
        weight = skeleton.weights[name]
        assert weight.dims == array.shape and weight.elem_type == TensorProto.FLOAT and not weight.external
        got = np.frombuffer(data[weight.offset:weight.offset + weight.length], np.float32).reshape(array.shape)
        np.testing.assert_array_equal(got, array)
    # what stays is the model's own structure: the weights declared as inputs, ONNX Runtime runs it with them fed
    session = ort.InferenceSession(skeleton.probe_model({}), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    got = session.run(["out"], {"x": x, "w": w, "bias": bias})[0]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["out"], {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_external_data_is_recorded_not_read(tmp_path):
    path = tmp_path / "net.onnx"
    small_net(path, external=True)
    skeleton = onnx_graph.read_skeleton(path)
    assert skeleton.weights["w"].external and skeleton.weights["w"].offset == -1


@pytest.mark.parametrize("opset", [11, 17])
def test_output_shapes_from_pinned_inputs(tmp_path, opset):
    """The dims the graph decides from the pinned input (through shape arithmetic: Shape -> Slice -> Concat ->
    Reshape, at an old opset too) are static; a dim only the data decides (NonZero's count) stays open."""
    path = tmp_path / "net.onnx"
    small_net(path, opset)
    skeleton = onnx_graph.read_skeleton(path)
    assert onnx_graph.output_shapes(skeleton, {"x": (TensorProto.FLOAT, [3, 64])}) == [(3, 16, 16), (2, None)]
    probe = skeleton.probe_model({"x": (TensorProto.FLOAT, [3, 64])})
    assert len(probe) < 2000  # the weights are declared, not held


def test_skeleton_refuses_what_is_not_a_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError):
        onnx_graph.read_skeleton(bad)


def test_an_input_left_open_stays_open(tmp_path):
    """A pinned shape may leave a dim open (None or -1, as frames' sizes do for a dim the frame decides): the probe
    declares it open (it once looped forever on -1); the Reshape's target then depends on the open dim, so ONNX
    Runtime does not know that output's shape (rank 0 in its answer: the adapter keeps the model's own dims)."""
    path = tmp_path / "net.onnx"
    small_net(path)
    skeleton = onnx_graph.read_skeleton(path)
    for open_dim in (None, -1):
        shapes = onnx_graph.output_shapes(skeleton, {"x": (TensorProto.FLOAT, [open_dim, 64])})
        assert shapes == [(), (2, None)]


def test_initializers_listed_as_inputs_are_cut_with_their_input(tmp_path):
    """A model that also lists its initializers among the graph's inputs (ONNX allows it: overridable defaults, as
    older exporters and torch's keep_initializers_as_inputs write): the skeleton drops a weight's input entry with
    it, so the weightless graph's inputs are the ones a caller feeds and the probe declares each weight once (it
    declared it twice, and ONNX Runtime refused the probe: no output dims decided)."""
    plain, listed = tmp_path / "net.onnx", tmp_path / "listed.onnx"
    small_net(plain)
    model = onnx.load(str(plain))
    model.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                             for i in model.graph.initializer)
    onnx.save(model, str(listed))
    skeleton = onnx_graph.read_skeleton(listed)
    assert set(skeleton.weights) == {"w", "bias"}
    assert [v.name for v in onnx_graph.graph_inputs(skeleton.model.graph)] == ["x"]
    assert [v.name for v in skeleton.model.graph.input] == ["x", "zero", "one", "tail"]  # the kept ones stay listed
    pinned = {"x": (TensorProto.FLOAT, [3, 64])}
    assert onnx_graph.output_shapes(skeleton, pinned) == [(3, 16, 16), (2, None)]


def test_a_malformed_message_inside_the_graph_is_a_value_error(tmp_path):
    """A message the skeleton's walk does not open (an input's type) malformed: parsing the weightless model is a
    ValueError naming the file, not protobuf's DecodeError."""
    path = tmp_path / "net.onnx"
    small_net(path)
    model = onnx.load(str(path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "QQQQ"
    data = model.SerializeToString()
    assert data.count(b"\x12\x04QQQQ") == 1
    path.write_bytes(data.replace(b"\x12\x04QQQQ", b"\x0f" + b"\x00" * 5))  # same length: wire type 7 inside
    skeleton = onnx_graph.read_skeleton(path)
    with pytest.raises(ValueError, match="not an ONNX model"):
        _ = skeleton.model
