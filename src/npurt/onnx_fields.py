"""The tags of the ONNX protobuf fields npurt reads or writes on the wire (field numbers from onnx/onnx.proto): the
one table ``modelfile`` (a model's ports) and ``onnx_graph`` (a graph without its weights) walk messages by."""

from __future__ import annotations

from .protowire import LEN, VARINT, field_tag

# ModelProto
MODEL_IR_VERSION = field_tag(1, VARINT)
MODEL_GRAPH = field_tag(7, LEN)
MODEL_OPSET_IMPORT = field_tag(8, LEN)
MODEL_METADATA_PROPS = field_tag(14, LEN)
MODEL_FUNCTIONS = field_tag(25, LEN)

# FunctionProto
FUNCTION_NODE = field_tag(7, LEN)

# OperatorSetIdProto
OPSET_DOMAIN = field_tag(1, LEN)
OPSET_VERSION = field_tag(2, VARINT)

# StringStringEntryProto
ENTRY_KEY = field_tag(1, LEN)
ENTRY_VALUE = field_tag(2, LEN)

# GraphProto
GRAPH_NODE = field_tag(1, LEN)
GRAPH_INITIALIZER = field_tag(5, LEN)
GRAPH_INPUT = field_tag(11, LEN)
GRAPH_OUTPUT = field_tag(12, LEN)
GRAPH_SPARSE_INITIALIZER = field_tag(15, LEN)

# NodeProto
NODE_OP_TYPE = field_tag(4, LEN)
NODE_ATTRIBUTE = field_tag(5, LEN)
NODE_DOMAIN = field_tag(7, LEN)
NODE_OUTPUT = field_tag(2, LEN)

# AttributeProto
ATTR_T = field_tag(5, LEN)
ATTR_G = field_tag(6, LEN)
ATTR_TENSORS = field_tag(10, LEN)
ATTR_GRAPHS = field_tag(11, LEN)
ATTR_SPARSE_TENSOR = field_tag(22, LEN)
ATTR_SPARSE_TENSORS = field_tag(23, LEN)
ATTR_NAME = field_tag(1, LEN)

# TensorProto (TENSOR_TYPE_*: TypeProto.Tensor)
TENSOR_NAME = field_tag(8, LEN)
TENSOR_DATA_LOCATION = field_tag(14, VARINT)
TENSOR_EXTERNAL_DATA = field_tag(13, LEN)  # StringStringEntryProto: location, offset, length, checksum
TENSOR_TYPE_ELEM_TYPE = field_tag(1, VARINT)
TENSOR_TYPE_SHAPE = field_tag(2, LEN)
TENSOR_DIMS = field_tag(1, VARINT)
TENSOR_DIMS_PACKED = field_tag(1, LEN)
TENSOR_DATA_TYPE = field_tag(2, VARINT)
TENSOR_FLOAT_DATA = field_tag(4, LEN)  # packed: the same little-endian bytes as raw_data
TENSOR_RAW_DATA = field_tag(9, LEN)
TENSOR_DOUBLE_DATA = field_tag(10, LEN)  # packed, likewise

# SparseTensorProto
SPARSE_VALUES = field_tag(1, LEN)
SPARSE_INDICES = field_tag(2, LEN)

# ValueInfoProto
VALUE_NAME = field_tag(1, LEN)
VALUE_TYPE = field_tag(2, LEN)

# TensorShapeProto
SHAPE_DIM = field_tag(1, LEN)

# TensorShapeProto.Dimension
DIM_VALUE = field_tag(1, VARINT)
DIM_PARAM = field_tag(2, LEN)
