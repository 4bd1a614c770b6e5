"""npurt.modelfile against onnx's own parser: the ports, opsets, domains, subgraph and external-data flags and metadata
the wire-format reader finds must be what ``onnx.load`` / ``ModelProto.FromString`` says, on ONNX's node test models,
the real models, hand-built wire-format corner cases, and truncated or mutated files (which must give a ValueError or
the same answer as onnx, never anything else).
"""

from __future__ import annotations

import os
from types import MappingProxyType

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from npurt.modelfile import (
    ELEMENT_TYPE_NAMES,
    OnnxModelInfo,
    OnnxPort,
    element_type_name,
    read_onnx_ports,
    read_onnx_ports_from_bytes,
)
from tests.conformance import cases
from tests.helpers.models import model_or_skip

# --- the reference: the same facts read from onnx's parsed ModelProto -------------------------------------------------

_KINDS = {"tensor_type": "tensor", "sequence_type": "sequence", "map_type": "map", "optional_type": "optional",
          "sparse_tensor_type": "sparse_tensor", "opaque_type": "unknown", None: "unknown"}


class NotAModel(Exception):
    """onnx parses the bytes, but they are no model the reader should accept."""


def _str(value: str | bytes) -> str:
    if not isinstance(value, str):  # upb hands out a proto2 string that is not UTF-8 as bytes
        raise NotAModel(f"not UTF-8: {value!r}")
    return value


def _reference_port(value: onnx.ValueInfoProto) -> OnnxPort:
    member = value.type.WhichOneof("value")
    kind = _KINDS[member]
    if kind not in ("tensor", "sparse_tensor"):
        return OnnxPort(_str(value.name), kind, 0, None)
    tensor = getattr(value.type, member)
    shape = None
    if tensor.HasField("shape"):
        dims = []
        for d in tensor.shape.dim:
            which = d.WhichOneof("value")
            dims.append(d.dim_value if which == "dim_value" else _str(d.dim_param) if which == "dim_param" else None)
        shape = tuple(dims)
    return OnnxPort(_str(value.name), kind, tensor.elem_type, shape)


def _graph_tensors(graph: onnx.GraphProto):
    """Every tensor a graph holds, in its subgraphs too (onnx's external_data_helper walks the same, plus sparse)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sparse in ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(attr.sparse_tensors):
                yield from (sparse.values, sparse.indices)
            for sub in _subgraphs(attr):
                yield from _graph_tensors(sub)


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    return ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)


def _all_nodes(nodes) -> list[onnx.NodeProto]:
    """The nodes and those of their subgraphs, recursively."""
    out = []
    for node in nodes:
        out.append(node)
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                out += _all_nodes(sub.node)
    return out


def _model_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of a model: its graph's, and its local functions' (with their subgraphs)."""
    return _all_nodes(model.graph.node) + [n for f in model.functions for n in _all_nodes(f.node)]


def _node_tensors(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        for sparse in ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(attr.sparse_tensors):
            yield from (sparse.values, sparse.indices)


def reference(model: onnx.ModelProto) -> OnnxModelInfo:
    if model.ir_version <= 0 or not model.HasField("graph") or (model.ir_version >= 3 and not model.opset_import):
        raise NotAModel("no IR version, no graph, or no opset_import")
    graph = model.graph
    initializers = {_str(t.name) for t in graph.initializer} | {_str(s.values.name) for s in graph.sparse_initializer}
    external = [t for t in [*_graph_tensors(graph), *(t for f in model.functions for n in _all_nodes(f.node)
                                                      for t in _node_tensors(n))]
                if t.data_location == TensorProto.EXTERNAL]
    return OnnxModelInfo(
        ir_version=model.ir_version,
        opset_imports=MappingProxyType({_str(o.domain): o.version for o in model.opset_import}),
        inputs=tuple(_reference_port(v) for v in graph.input if _str(v.name) not in initializers),
        outputs=tuple(_reference_port(v) for v in graph.output),
        node_count=len(graph.node),
        operator_domains=frozenset(_str(n.domain) for n in _model_nodes(model)),
        operator_types=frozenset(_str(n.op_type) for n in _model_nodes(model)),
        has_subgraphs=any(_subgraphs(a) for n in [*graph.node, *(n for f in model.functions for n in f.node)]
                          for a in n.attribute),
        uses_external_data=bool(external),
        external_data_files=frozenset(ExternalDataInfo(t).location for t in external),
        metadata_props=MappingProxyType({_str(p.key): _str(p.value) for p in model.metadata_props}),
    )


def reference_or_none(data: bytes) -> OnnxModelInfo | None:
    """What onnx says about ``data``, or None where onnx cannot parse it or it is no model."""
    try:
        return reference(onnx.ModelProto.FromString(data))
    except (NotAModel, DecodeError):
        return None


def read_or_error(data: bytes) -> OnnxModelInfo | ValueError:
    try:
        return read_onnx_ports_from_bytes(data)
    except ValueError as e:
        return e


def assert_like_onnx(data: bytes, *, lenient: bool = False) -> None:
    """The reader answers what onnx answers: the same facts, or a ValueError where onnx finds no model.

    ``lenient``: where onnx finds no model the reader may still answer (it does not validate what it skips).
    """
    expected = reference_or_none(data)
    got = read_or_error(data)
    if expected is not None:
        assert got == expected
    elif not lenient:
        assert isinstance(got, ValueError), f"onnx finds no model here, the reader answered {got}"
    else:
        assert isinstance(got, (ValueError, OnnxModelInfo))


# --- ONNX's node test models ------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def node_models() -> dict[str, bytes]:
    """The ~1,900 models of ONNX's node test set, serialized, as the conformance suite writes them once per onnx
    version (``tests.conformance.cases``: building them computes every case's data too, ~10 s)."""
    root = cases.materialize()
    return {name: (root / name / "model.onnx").read_bytes() for name in cases.case_names(root)}


def test_node_models_match_onnx(node_models):
    assert len(node_models) > 1500
    kinds: set[str] = set()
    for name, data in node_models.items():
        expected = reference(onnx.ModelProto.FromString(data))
        assert read_onnx_ports_from_bytes(data) == expected, name
        kinds |= {p.kind for p in expected.inputs + expected.outputs}
    # The comparison above went through these kinds (map, sparse_tensor and opaque types: test_port_kinds).
    assert {"tensor", "sequence", "optional"} <= kinds


def test_node_models_through_files(node_models, tmp_path):
    """The mmap path gives what the bytes path gives (a sample: writing 1,900 files adds nothing)."""
    for name in sorted(node_models)[::97]:
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(node_models[name])
        assert read_onnx_ports(path) == read_onnx_ports_from_bytes(node_models[name]), name


# --- the real models --------------------------------------------------------------------------------------------------

REAL_MODELS = ["ocr_det", "ocr_rec", "ocr_cls", "silero_vad", "silero_vad_op18_ifless"]


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_match_onnx(name):
    path = model_or_skip(name)
    got = read_onnx_ports(path)
    assert got == reference(onnx.load(str(path), load_external_data=False))
    assert got.inputs and got.outputs and got.node_count > 0


def test_ocr_recogniser_keeps_its_dictionary_in_metadata():
    path = model_or_skip("ocr_rec")
    info = read_onnx_ports(path)
    characters = info.metadata_props["character"].splitlines()
    assert len(characters) > 6000  # one per class but the blank: the output's last dim is 6625
    assert info.outputs[0].shape[-1] == 6625 and info.outputs[0].elem_type_name == "FLOAT"
    assert info.inputs[0].shape[1] == 3 and isinstance(info.inputs[0].shape[0], str)


# --- models built for one feature -------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8, **graph_fields) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers), **graph_fields)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def test_external_data(tmp_path):
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], [weight])
    inline = tmp_path / "inline.onnx"
    onnx.save(model, inline)
    external = tmp_path / "external.onnx"
    onnx.save(model, external, save_as_external_data=True, all_tensors_to_one_file=True, location="external.bin")
    assert (tmp_path / "external.bin").stat().st_size == 4096 * 4

    assert not read_onnx_ports(inline).uses_external_data
    info = read_onnx_ports(external)
    assert info.uses_external_data and info.external_data_files == {"external.bin"}
    assert read_onnx_ports(inline).external_data_files == frozenset()
    assert info == reference(onnx.load(str(external), load_external_data=False))
    assert info.inputs == (OnnxPort("x", "tensor", TensorProto.FLOAT, ("n", 64)),)
    (tmp_path / "external.bin").unlink()  # the reader never opens the data file
    assert read_onnx_ports(external) == info


def test_subgraphs_in_a_graphs_attribute():
    """A custom op holding a list of graphs (no standard op does; If / Loop / Scan hold one each)."""
    body = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], domain="com.inner")], "body", [],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    node = helper.make_node("Bodies", ["x"], ["y"], domain="com.example")
    node.attribute.append(helper.make_attribute("bodies", [body, body]))
    assert node.attribute[0].type == onnx.AttributeProto.GRAPHS
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    info = read_onnx_ports_from_bytes(model.SerializeToString())
    assert info.has_subgraphs and info.operator_domains == {"com.example", "com.inner"}
    assert info == reference(model)


def test_external_data_of_a_constant_inside_a_subgraph(tmp_path):
    constant = numpy_helper.from_array(np.ones(1024, dtype=np.float32), "c")
    branch = helper.make_graph([helper.make_node("Constant", [], ["c"], value=constant)], "then", [],
                               [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1024])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["z"], domain="com.example")], "else", [],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1024])])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)],
                   [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    path = tmp_path / "if.onnx"
    onnx.save(model, path, save_as_external_data=True, location="if.bin", size_threshold=0, convert_attribute=True)
    info = read_onnx_ports(path)
    assert info.uses_external_data and info.has_subgraphs
    assert info.operator_domains == {"", "com.example"}
    assert dict(info.opset_imports) == {"": 17, "com.example": 1}
    assert info == reference(onnx.load(str(path), load_external_data=False))


def test_initializers_listed_as_inputs_are_not_inputs():
    """IR 3 models list every initializer among the graph inputs; those are weights, not ports."""
    weight = numpy_helper.from_array(np.ones((2, 2), dtype=np.float32), "w")
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [weight], opset=7, ir_version=3)
    info = read_onnx_ports_from_bytes(model.SerializeToString())
    assert info.input_names == ("x",) and info.output_names == ("y",)
    assert info.ir_version == 3


def test_dims_value_param_none_and_zero():
    value = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [0, "batch", None, 7, -1])
    unranked = helper.make_tensor_value_info("u", TensorProto.INT64, None)
    scalar = helper.make_tensor_value_info("s", TensorProto.UINT4, [])
    sequence = helper.make_tensor_sequence_value_info("q", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [value, unranked, scalar],
                   [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None), sequence])
    info = read_onnx_ports_from_bytes(model.SerializeToString())
    x, u, s = info.inputs
    assert x == OnnxPort("x", "tensor", TensorProto.BFLOAT16, (0, "batch", None, 7, -1))
    assert x.elem_type_name == "BFLOAT16"
    assert u.shape is None and s.shape == () and s.elem_type_name == "UINT4"
    assert info.outputs[1] == OnnxPort("q", "sequence", 0, None)
    assert info == reference(model)


def test_port_kinds():
    tensor = helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    opaque = onnx.TypeProto()
    opaque.opaque_type.domain = "com.example"
    untyped = onnx.ValueInfoProto(name="untyped")
    inputs = [helper.make_value_info("map", helper.make_map_type_proto(TensorProto.INT64, tensor)),
              helper.make_sparse_tensor_value_info("sparse", TensorProto.FLOAT16, [4, "n"]),
              helper.make_value_info("optional", helper.make_optional_type_proto(tensor)),
              helper.make_value_info("opaque", opaque), untyped]
    model = _model([helper.make_node("Identity", ["sparse"], ["y"])], inputs,
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    info = read_onnx_ports_from_bytes(model.SerializeToString())
    assert [(p.kind, p.elem_type, p.shape) for p in info.inputs] == [
        ("map", 0, None), ("sparse_tensor", TensorProto.FLOAT16, (4, "n")), ("optional", 0, None),
        ("unknown", 0, None), ("unknown", 0, None)]
    assert info == reference(model)


def test_element_type_names_are_onnx_names():
    assert dict(enumerate(ELEMENT_TYPE_NAMES)) == {v: k for k, v in TensorProto.DataType.items()}
    assert element_type_name(99) == "UNKNOWN_99" and element_type_name(-1) == "UNKNOWN_-1"


# --- the wire format's own rules --------------------------------------------------------------------------------------

def _simple_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_a_message_field_given_twice_is_merged():
    base = _simple_model()
    more = onnx.GraphProto(input=[helper.make_tensor_value_info("x2", TensorProto.INT8, ["k"])],
                           node=[helper.make_node("Relu", ["x2"], ["y2"], domain="com.microsoft")])
    data = base.SerializeToString() + _field(7, more.SerializeToString())
    info = read_onnx_ports_from_bytes(data)
    assert info.input_names == ("x", "x2") and info.node_count == 2
    assert info.operator_domains == {"", "com.microsoft"}
    assert_like_onnx(data)


def test_wrong_wire_types_and_unknown_enum_values_are_unknown_fields():
    model = _simple_model()
    model.graph.initializer.append(numpy_helper.from_array(np.ones(1, dtype=np.float32), "w"))
    model.graph.initializer[0].data_location = TensorProto.EXTERNAL
    tensor = model.graph.initializer[0].SerializeToString() + bytes([14 << 3, 9])  # data_location 9: unknown
    model.graph.ClearField("initializer")
    graph = model.graph.SerializeToString() + _field(5, tensor) + bytes([12 << 3, 1])  # output as a varint
    model.ClearField("graph")
    data = model.SerializeToString() + _field(7, graph) + bytes([7 << 3, 5])  # graph as a varint
    info = read_onnx_ports_from_bytes(data)
    assert info.uses_external_data and info.output_names == ("y",)
    assert_like_onnx(data)


def test_a_oneof_member_replaces_another_and_merges_with_itself():
    tensor = helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n"]).SerializeToString()
    more_dims = helper.make_tensor_type_proto(TensorProto.INT8, [5]).SerializeToString()
    sequence = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    sequence = sequence.SerializeToString()
    # TypeProto fields: tensor_type 1, sequence_type 4; a TypeProto given twice in a ValueInfoProto merges too
    typings = {
        "tensor_then_sequence": _field(2, tensor + sequence),
        "sequence_then_tensor": _field(2, sequence + tensor),
        "tensor_twice": _field(2, tensor) + _field(2, more_dims),
    }
    inputs = b"".join(_field(11, _field(1, name.encode()) + typing) for name, typing in typings.items())
    graph = _simple_model().graph
    graph.ClearField("input")
    model = _simple_model()
    model.ClearField("graph")
    data = model.SerializeToString() + _field(7, graph.SerializeToString() + inputs)
    info = read_onnx_ports_from_bytes(data)
    assert [(p.kind, p.elem_type, p.shape) for p in info.inputs] == [
        ("sequence", 0, None), ("tensor", TensorProto.FLOAT, (2, "n")), ("tensor", TensorProto.INT8, (2, "n", 5))]
    assert_like_onnx(data)


def test_groups_and_fixed_size_unknown_fields_are_skipped():
    data = _simple_model().SerializeToString()
    group = bytes([19 << 3 | 3, 0x01, 0x08, 0x01, 19 << 3 | 4, 0x01])  # field 19: start, varint 1:1, end
    fixed = bytes([20 << 3 | 1, 0x01]) + bytes(8) + bytes([21 << 3 | 5, 0x01]) + bytes(4)
    assert read_onnx_ports_from_bytes(data + group + fixed) == read_onnx_ports_from_bytes(data)
    assert_like_onnx(data + group + fixed)


@pytest.mark.parametrize("tail, message", [
    (bytes([0x08]) + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    (bytes([0x08, 0xff]), "truncated"),
    (bytes([0x0f, 0x00]), "wire type 7"),
    (bytes([0x00, 0x01]), "field number 0"),
    (bytes([0x3c]), "end-group"),
    (bytes([0x9b, 0x01, 0x08, 0x01]), "no end tag"),
    (bytes([0x9b, 0x01, 0xa4, 0x01]), "ended by the end tag of field 20"),
    (bytes([0x80, 0x80, 0x80, 0x80, 0x10, 0x01]), "field number 536870912"),
    (bytes([0x3a, 0x05, 0x0a]), "holds 5 bytes"),
])
def test_malformed_wire_format_is_a_value_error(tail, message):
    data = _simple_model().SerializeToString() + tail
    with pytest.raises(ValueError, match=message):
        read_onnx_ports_from_bytes(data)
    assert reference_or_none(data) is None


def test_deep_nesting_is_a_value_error_not_a_recursion_error():
    """Subgraphs nested past protobuf's depth limit (onnx cannot even build these: written as bytes)."""
    model = _simple_model()
    graph = model.graph.SerializeToString()
    for _ in range(40):  # graph > node > attribute > graph: 3 levels each
        graph = _field(1, _field(5, _field(1, b"g") + _field(6, graph)))  # a node with an attribute g
    model.ClearField("graph")
    data = model.SerializeToString() + _field(7, graph)
    with pytest.raises(ValueError, match="nested deeper than 100"):
        read_onnx_ports_from_bytes(data)
    assert reference_or_none(data) is None

    groups = bytes([9 << 3 | 3]) * 5000  # field 9: no field of ModelProto
    with pytest.raises(ValueError, match="nested deeper than 100"):
        read_onnx_ports_from_bytes(_simple_model().SerializeToString() + groups)


def test_ir_version_graph_and_opsets_are_required():
    model = _simple_model()
    no_graph = onnx.ModelProto(ir_version=8, opset_import=model.opset_import)
    no_opsets = onnx.ModelProto(ir_version=8, graph=model.graph)
    no_ir = onnx.ModelProto(graph=model.graph, opset_import=model.opset_import)
    for data, message in ((no_graph, "no graph"), (no_opsets, "no opset_import"), (no_ir, "no IR version")):
        with pytest.raises(ValueError, match=message):
            read_onnx_ports_from_bytes(data.SerializeToString())


# --- files that are no model ------------------------------------------------------------------------------------------

def test_files_that_are_not_models(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "model.xml").write_text('<?xml version="1.0"?>\n<net name="m" version="11"><layers/></net>\n')
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(7).bytes(4096))
    (tmp_path / "text.onnx").write_text("this is not a model\n" * 20)
    for name, message in (("empty.onnx", "the file is empty"), ("model.xml", "it is XML"),
                          ("random.onnx", "not an ONNX model"), ("text.onnx", "not an ONNX model")):
        with pytest.raises(ValueError, match=message):
            read_onnx_ports(tmp_path / name)
    with pytest.raises(ValueError, match="is a directory"):
        read_onnx_ports(tmp_path)
    os.mkfifo(tmp_path / "fifo.onnx")
    with pytest.raises(ValueError, match="not a regular file"):
        read_onnx_ports(tmp_path / "fifo.onnx")
    with pytest.raises(ValueError, match="not a regular file"):
        read_onnx_ports("/dev/zero")
    with pytest.raises(FileNotFoundError):
        read_onnx_ports(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="the buffer is empty"):
        read_onnx_ports_from_bytes(b"")


def _small_real_model() -> bytes:
    # subgraphs, symbolic dims, several inputs: most of the reader's paths
    return model_or_skip("silero_vad").read_bytes()


def test_truncated_files(tmp_path):
    """Every cut of a model either still parses (a cut between top-level fields) to what onnx says of the same bytes,
    or is a ValueError; never anything else."""
    data = _small_real_model()
    cuts = set(range(0, min(len(data), 2048))) | set(range(0, len(data), max(1, len(data) // 500)))
    cuts |= set(range(max(0, len(data) - 2048), len(data)))
    for cut in sorted(cuts):
        assert_like_onnx(data[:cut])
    for cut in (1, 5, len(data) // 3, len(data) - 1):  # through the mmap path too
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=f"{path.name} is not an ONNX model"):
            read_onnx_ports(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes(data):
    assert_like_onnx(data, lenient=True)


_SMALL_MODEL = _simple_model().SerializeToString()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_SMALL_MODEL) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_model(mutations):
    """Bytes changed anywhere in a small model: the same answer as onnx, or a ValueError."""
    data = bytearray(_SMALL_MODEL)
    for at, value in mutations:
        data[at] = value
    assert_like_onnx(bytes(data), lenient=True)


def test_hash_and_immutability():
    info = read_onnx_ports_from_bytes(_SMALL_MODEL)
    assert hash(info) == hash(read_onnx_ports_from_bytes(_SMALL_MODEL))
    with pytest.raises(TypeError):
        info.metadata_props["k"] = "v"  # type: ignore[index]
    with pytest.raises(AttributeError):
        info.ir_version = 9  # type: ignore[misc]


def test_reads_without_loading_the_file(tmp_path):
    """A model whose weights dwarf its graph: the reader touches a few pages, not the weights."""
    weight = numpy_helper.from_array(np.zeros(16 << 20, dtype=np.uint8), "w")  # 16 MiB
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.UINT8, [16 << 20])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [16 << 20])], [weight])
    path = tmp_path / "big.onnx"
    onnx.save(model, path)
    import tracemalloc

    tracemalloc.start()
    info = read_onnx_ports(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert info.input_names == ("x",)
    assert peak < 1 << 20, f"the reader allocated {peak} bytes for a model of {os.path.getsize(path)}"


def test_nodes_of_model_local_functions_are_walked(tmp_path):
    """A model whose graph calls a local function (FunctionProto, ModelProto field 25): the function's nodes are the
    model's too. Their operators (a custom domain's, a Softplus) and external data count; the reader missed them
    before it walked ModelProto.functions."""
    from onnx import external_data_helper

    weight = numpy_helper.from_array(np.ones((4,), np.float32), "w")
    body = [helper.make_node("Constant", [], ["c"], value=weight),
            helper.make_node("Softplus", ["x"], ["s"]),
            helper.make_node("Mul", ["s", "c"], ["y"])]
    function = helper.make_function("npurt.test", "ScaledSoftplus", ["x"], ["y"], body,
                                    [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("ScaledSoftplus", ["input"], ["output"], domain="npurt.test")], "g",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, functions=[function], ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("npurt.test", 1)])
    info = read_onnx_ports_from_bytes(model.SerializeToString())
    assert info.operator_types == {"ScaledSoftplus", "Constant", "Softplus", "Mul"}
    assert info.operator_domains == {"npurt.test", ""}
    assert not info.uses_external_data
    assert_like_onnx(model.SerializeToString())
    # the function's Constant keeps its tensor in an external file: the model uses external data
    tensor = model.functions[0].node[0].attribute[0].t
    external_data_helper.set_external_data(tensor, "weights.bin")
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    assert read_onnx_ports_from_bytes(model.SerializeToString()).uses_external_data
