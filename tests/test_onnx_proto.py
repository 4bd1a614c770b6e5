"""npurt.onnx_proto: ONNX's messages without the onnx package's import, and helpers that build what onnx.helper /
onnx.numpy_helper build (byte for byte), so that a decoder's cold load derives and proves its form without onnx."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npurt import onnx_proto
from tests.helpers.decoders import MODEL_FILE, form_folder


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_messages_are_onnxs_own_classes_either_order():
    """Loaded without onnx, the classes are the ones a later ``import onnx`` gives (and the other way round): a
    message of one is a message of the other, and onnx's checker takes a model made here."""
    first = _fresh(
        "import sys; from npurt import onnx_proto; M = onnx_proto.messages(); print('onnx' in sys.modules); "
        "import onnx; print(all(getattr(onnx, n) is getattr(M, n) for n in ('ModelProto', 'GraphProto', "
        "'NodeProto', 'TensorProto', 'ValueInfoProto', 'AttributeProto')))")
    assert first.splitlines() == ["False", "True"]
    second = _fresh("import onnx; from npurt import onnx_proto; print(onnx_proto.ModelProto is onnx.ModelProto)")
    assert second == "True"


def test_a_cold_decoder_load_imports_no_onnx(tmp_path):
    """An ONNX Runtime GenAI builder decoder's first load (no cache_dir: its form derived, written and proved by its
    parts) in a fresh process imports neither onnx nor numpy.random, and is proved as before."""
    folder = form_folder(tmp_path, "gqa", "builder")
    code = ("import sys; from npurt import RunnerFactory; r = RunnerFactory.create_runner('VAIML', "
            f"{str(folder / MODEL_FILE)!r}, {{'device': 'CPU', 'decoder': {{'max_length': 96, 'prefill_chunk': 4}}}}); "
            "print(sorted(m for m in ('onnx', 'numpy.random', 'ml_dtypes') if m in sys.modules)); "
            "print(r.decoder.verification)")
    imported, verification = _fresh(code).splitlines()[-2:]
    assert imported == "[]"
    assert verification.startswith("by its parts on onnxruntime")


@pytest.mark.parametrize("attrs", [
    {}, {"axis": 2}, {"to": TensorProto.INT64, "keepdims": 0}, {"alpha": 0.5, "beta": np.float32(2.0)},
    {"flag": True, "count": np.int64(3)}, {"mode": "constant"}, {"raw": b"\x00\xff"}, {"perm": [0, 2, 1, 3]},
    {"scales": [1.0, 2.5]}, {"mixed": [1, 2.5]}, {"names": ["a", b"b"]}, {"pads": np.array([1, 2], np.int64)},
    {"value": numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))}, {"skipped": None, "axis": 1},
    {"body": helper.make_graph([], "g", [], [])},
])
def test_make_node_is_onnx_helpers(attrs):
    for domain in (None, "", "com.microsoft"):
        mine = onnx_proto.make_node("Op", ["a", "", "b"], ["c"], name="n", domain=domain, **attrs)
        theirs = helper.make_node("Op", ["a", "", "b"], ["c"], name="n", domain=domain, **attrs)
        assert mine.SerializeToString() == theirs.SerializeToString(), (attrs, domain)


def test_a_value_onnx_refuses_is_refused_alike():
    with pytest.raises(ValueError):
        onnx_proto.make_node("Op", [], ["y"], empty=[])
    with pytest.raises(TypeError):
        onnx_proto.make_node("Op", [], ["y"], bad=object())


@pytest.mark.parametrize("shape", [None, [], [1, "sequence", None, 4]])
@pytest.mark.parametrize("elem", [TensorProto.UNDEFINED, TensorProto.FLOAT, TensorProto.INT64])
def test_value_infos_graphs_and_models_are_onnx_helpers(shape, elem):
    mine = onnx_proto.make_tensor_value_info("x", elem, shape)
    assert mine.SerializeToString() == helper.make_tensor_value_info("x", elem, shape).SerializeToString()
    assert onnx_proto.make_empty_value_info("y") == helper.make_empty_tensor_value_info("y")
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    weights = [numpy_helper.from_array(np.ones(3, np.float32), "w")]
    graph = onnx_proto.make_graph(nodes, "g", [mine], [helper.make_empty_tensor_value_info("y")], weights)
    assert graph == helper.make_graph(nodes, "g", [mine], [helper.make_empty_tensor_value_info("y")], weights)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    theirs = helper.make_model(graph, opset_imports=opsets)
    theirs.ir_version = 8
    assert onnx_proto.make_model(graph, opsets, ir_version=8).SerializeToString() == theirs.SerializeToString()


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(12, dtype=np.float32).reshape(3, 4).T,
    np.array(3.5, np.float64), np.array([1, -2], np.int64), np.array([True, False]), np.zeros(0, np.float16),
    np.array([1, 2], np.uint8), np.array([-1, 7], np.int8), np.array([1, 2], np.uint16), np.array([-3], np.int16),
    np.array([5], np.int32), np.array([5], np.uint32), np.array([5], np.uint64), np.array([1 + 2j], np.complex64),
    np.array(["a", "bc"], dtype=object),
])
def test_arrays_are_onnx_numpy_helpers(array):
    for name in (None, "w"):
        mine = onnx_proto.from_array(array, name)
        assert mine.SerializeToString() == numpy_helper.from_array(array, name).SerializeToString()
        back = onnx_proto.to_array(mine)
        expected = numpy_helper.to_array(mine)
        assert back.dtype == expected.dtype and back.shape == expected.shape and np.array_equal(back, expected)


def test_typed_fields_and_dtypes_are_onnxs():
    """A tensor with its values in a typed field (not raw_data) reads as onnx reads it; every element type maps to
    and from numpy as onnx maps it."""
    typed = helper.make_tensor("t", TensorProto.FLOAT16, [2], np.array([1.5, -2], np.float16))
    assert np.array_equal(onnx_proto.to_array(typed), numpy_helper.to_array(typed))
    assert onnx_proto.to_array(typed).dtype == np.float16
    for elem in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT4, TensorProto.DOUBLE,
                 TensorProto.BOOL, TensorProto.UINT64, TensorProto.COMPLEX128, TensorProto.FLOAT8E4M3FN):
        dtype = onnx_proto.tensor_dtype_to_np_dtype(elem)
        assert dtype == helper.tensor_dtype_to_np_dtype(elem)
        assert onnx_proto.np_dtype_to_tensor_dtype(dtype) == helper.np_dtype_to_tensor_dtype(dtype)


def test_set_shape_names_open_dims():
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", 3])
    onnx_proto.set_shape(value, (None, 4, -1), TensorProto.FLOAT16)
    dims = value.type.tensor_type.shape.dim
    assert [(d.dim_param, d.dim_value) for d in dims] == [("x:0", 0), ("", 4), ("x:2", 0)]
    assert value.type.tensor_type.elem_type == TensorProto.FLOAT16
    onnx_proto.set_shape(value, ())
    assert value.type.tensor_type.HasField("shape") and not value.type.tensor_type.shape.dim
    assert isinstance(value, onnx.ValueInfoProto)
