"""npurt.modelinfo: what a model file declares (ONNX through npurt's reader, OpenVINO IR through OpenVINO), the
"not a model" messages, the shape rule for dynamic inputs; and factory.create_auto's account of AUTO's choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import openvino as ov
import pytest
from onnx import TensorProto, helper

from npurt import RunnerFactory
from npurt.factory import AutoChoice, auto_order, create_auto
from npurt.modelinfo import ModelFileError, check_input_shapes, concrete_input_shapes, inspect_model
from npurt.models import default_model_path


def test_default_model_ports_as_declared():
    model = inspect_model(default_model_path())
    assert model.format == "onnx"
    (image,) = model.inputs
    assert (image.name, image.dtype, image.shape, image.dim_names) == ("image", "float32", (None, 1, 8, 8),
                                                                       ("N", None, None, None))
    assert image.shape_text() == "[?, 1, 8, 8]" and image.open_dims == [0] and not image.is_static
    assert [(p.name, p.shape) for p in model.outputs] == [("scores", (None, 10))]


def _model(tmp_path: Path, dims: list, elem: int = TensorProto.FLOAT) -> Path:
    x = helper.make_tensor_value_info("x", elem, dims)
    y = helper.make_tensor_value_info("y", elem, dims)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_exporters_open_dims_are_open(tmp_path):
    # Paddle's exporter writes -1 for an open dim and "?" as a dim name that names nothing
    model = inspect_model(_model(tmp_path, [-1, 3, "?", "W"]))
    (x,) = model.inputs
    assert x.shape == (None, 3, None, None) and x.dim_names == (None, None, None, "W")
    assert x.describe_open_dims() == "dim 0, dim 2, dim 3 (W)"
    assert x.suggested_shape_flag() == "--shape x=1,3,D2,D3"


def test_element_types_by_numpy_name(tmp_path):
    assert inspect_model(_model(tmp_path, [2], TensorProto.FLOAT16)).inputs[0].dtype == "float16"
    assert inspect_model(_model(tmp_path, [2], TensorProto.BFLOAT16)).inputs[0].dtype == "bfloat16"


def test_openvino_ir_is_read_through_openvino(tmp_path):
    xml = tmp_path / "digits.xml"
    ov.save_model(ov.Core().read_model(str(default_model_path())), str(xml))
    model = inspect_model(xml)
    assert model.format == "openvino-ir"
    assert [(p.name, p.dtype, p.shape) for p in model.inputs] == [("image", "float32", (None, 1, 8, 8))]
    assert [p.shape for p in model.outputs] == [(None, 10)]
    xml.with_suffix(".bin").unlink()
    with pytest.raises(ModelFileError, match="needs its weights file .*digits.bin, which is missing"):
        inspect_model(xml)


@pytest.mark.parametrize("name, content, message", [
    ("text.onnx", b"this is not a model\n", "is not a model: not an ONNX file"),
    ("empty.onnx", b"", r"is not a model: not an ONNX file \(the file is empty\)"),
    ("page.xml", b"<html><body/></html>", "is not an OpenVINO IR model: its root element is <html>"),
    ("broken.xml", b"<net", "is not a model: not an XML file"),
])
def test_not_a_model_says_what_it_is(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        inspect_model(path)


def test_a_protobuf_without_nodes_is_no_model(tmp_path):
    path = tmp_path / "hollow.onnx"
    hollow = onnx.ModelProto(ir_version=9, graph=onnx.GraphProto(name="g"), opset_import=[helper.make_opsetid("", 13)])
    path.write_bytes(hollow.SerializeToString())
    with pytest.raises(ModelFileError, match="without nodes"):
        inspect_model(path)


def test_missing_and_directory(tmp_path):
    with pytest.raises(ModelFileError, match="model file not found"):
        inspect_model(tmp_path / "none.onnx")
    with pytest.raises(ModelFileError, match="is a directory"):
        inspect_model(tmp_path)


def test_shape_rule_batch_as_1_others_unresolved(tmp_path):
    digits = inspect_model(default_model_path())
    choice = concrete_input_shapes(digits)
    assert choice.shapes == {"image": (1, 1, 8, 8)} and choice.picked == {"image": (1, 1, 8, 8)}
    assert not choice.unresolved
    assert concrete_input_shapes(digits, {"image": [5, 1, 8, 8]}).picked == {}

    cls_like = inspect_model(_model(tmp_path, [-1, 3, "?", "?"]))
    choice = concrete_input_shapes(cls_like)
    assert [p.name for p in choice.unresolved] == ["x"] and choice.shapes == {}
    check_input_shapes(cls_like, {"x": (1, 3, 48, 192)})
    with pytest.raises(ValueError, match=r"does not fit input 'x' of shape \[\?, 3, \?, \?\]"):
        check_input_shapes(cls_like, {"x": (1, 4, 48, 192)})
    with pytest.raises(ValueError, match="the model has no input 'y'"):
        check_input_shapes(cls_like, {"y": (1,)})


def test_create_auto_says_which_backend_and_why():
    order = auto_order()
    if not order:
        pytest.skip("no backend installed")
    runner, choice = create_auto(default_model_path(), {"device": "CPU"})
    try:
        assert isinstance(choice, AutoChoice) and choice.order == tuple(order)
        first = next(n for n, _ in order)
        assert choice.backend == runner.runner_type == first and choice.failures == ()
        if not any(npu for _, npu in order):
            assert choice.explain().startswith(f"no installed backend sees an NPU; {first} is the first of")
        runner.run({"image": np.zeros((3, 1, 8, 8), np.float32)})
    finally:
        runner.close()
    assert RunnerFactory.create_runner("AUTO", default_model_path(), {"device": "CPU"}).runner_type == first
