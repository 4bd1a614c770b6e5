"""Runner.placement on the CPU devices of both engines: one entry per node as the engine partitioned it, named as
the model names it, with a reason only where a node is not on the device asked for."""

from __future__ import annotations

import warnings

import onnx
import pytest
from onnx import TensorProto, helper

from npurt import RunnerFactory
from npurt.models import DEFAULT_MODEL
from tests.helpers.models import model_or_skip


def test_onnx_runtime_names_nodes_as_the_model_does_unnamed_ones_by_their_first_output(tmp_path):
    """ONNX Runtime lists an unnamed node with an empty name: placement names it by its first output. PP-OCR's
    classifier (every node named) keeps the model's names; unoptimized, every node is the model's own."""
    path = model_or_skip("ocr_cls")
    model = onnx.load(str(path), load_external_data=False)
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU",
                                                     "engine_options": {"graph_optimization_level": "disable"}}) as r:
        placement = r.placement
        assert r.device_info.placement == (("CPUExecutionProvider", len(placement)),)
    assert placement and all(p.device == "CPUExecutionProvider" and p.reason is None for p in placement)
    assert [p.node for p in placement] == [n.name for n in model.graph.node if n.op_type != "Constant"]

    nodes = [helper.make_node("Relu", ["x"], ["first"]), helper.make_node("Neg", ["first"], ["second"], name="neg"),
             helper.make_node("Relu", ["second"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    unnamed = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "unnamed.onnx"
    onnx.save(unnamed, path)
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU"}) as r:
        assert [(p.node, p.op_type) for p in r.placement] == [("first", "Relu"), ("neg", "Neg"), ("y", "Relu")]


def test_a_fallback_gives_every_node_its_reason():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with RunnerFactory.create_runner("VAIML", DEFAULT_MODEL, {"device": "NPU"}) as r:
            assert r.device_info.fell_back
            assert all(p.device == "CPUExecutionProvider" and p.reason.startswith(
                "VitisAIExecutionProvider was asked for and is not available here: the Vitis AI execution provider "
                "is not installed") for p in r.placement)
        with RunnerFactory.create_runner("OPENVINO", DEFAULT_MODEL, {"device": "NPU"}) as r:
            assert all(p.device == "CPU" and p.reason.startswith("NPU was asked for and is not available here")
                       for p in r.placement)


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_on_the_device_asked_for_no_node_has_a_reason(backend):
    with RunnerFactory.create_runner(backend, DEFAULT_MODEL, {"device": "CPU"}) as r:
        placement = r.placement
        assert placement and all(p.reason is None for p in placement)
        devices = {p.device for p in placement}
        assert devices == ({"CPU"} if backend == "OPENVINO" else {"CPUExecutionProvider"})
        if backend == "OPENVINO":  # OpenVINO's operations, from Core.query_model
            assert {"Convolution", "Softmax"} <= {p.op_type for p in placement}
