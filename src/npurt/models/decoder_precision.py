"""The precisions test decoders are published in besides float32, made from a float32 export the way exporters make
them:

- int4: `quantize_int4`, ONNX Runtime's own ``MatMulNBitsQuantizer`` (what onnxruntime-genai's model builder and
  Olive call): every MatMul with a constant weight becomes a com.microsoft ``MatMulNBits`` (4 bits, ``block_size``
  weights per scale along K, symmetric or with zero points, ``accuracy_level`` 0 = the activations' own precision,
  4 = int8 activations). Needs ``onnx_ir`` (a dependency of that quantizer, not of onnxruntime).
- fp16: `to_float16`, onnxruntime.transformers' float16 converter: weights and activations in float16, the past,
  present and logits too (as the builder's fp16 exports); the int64 input_ids and attention_mask stay int64.

ONNX Runtime and its tools are imported when called.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx

PRECISIONS = ("fp32", "fp16", "int4")


@dataclass(frozen=True)
class Int4:
    """MatMulNBitsQuantizer's settings: ``block_size`` (16 .. 256, a power of two), ``symmetric`` (False: a zero
    point per block), ``accuracy_level`` (0: unset, the activations' precision; 1 fp32, 2 fp16, 3 bf16, 4 int8)."""

    block_size: int = 32
    symmetric: bool = True
    accuracy_level: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 16 or self.block_size > 256 or self.block_size & (self.block_size - 1):
            raise ValueError(f"Int4.block_size must be a power of two in 16..256, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"Int4.accuracy_level must be 0..4, got {self.accuracy_level}")

    @property
    def label(self) -> str:
        """e.g. ``int4-b32-sym-acc0``: a folder name."""
        return f"int4-b{self.block_size}-{'sym' if self.symmetric else 'zp'}-acc{self.accuracy_level}"


def quantize_int4(model: onnx.ModelProto, int4: Int4 | None = None) -> onnx.ModelProto:
    """``model`` with its constant-weight MatMuls as int4 ``MatMulNBits`` (a new model; ``model`` is not changed).
    ImportError naming ``onnx_ir`` where that package is missing."""
    int4 = int4 or Int4()
    try:
        import onnx_ir  # noqa: F401  (the quantizer imports it lazily; fail here, saying what is missing)
    except ImportError as e:
        raise ImportError("int4 quantization needs the onnx_ir package (pip install onnx_ir), which ONNX Runtime's "
                          "MatMulNBitsQuantizer uses") from e
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=int4.block_size, is_symmetric=int4.symmetric,
                                          accuracy_level=int4.accuracy_level)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    quantizer = MatMulNBitsQuantizer(copy, algo_config=config)
    quiet = logging.getLogger("onnxruntime.quantization")  # it logs every node at INFO
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        quiet.setLevel(level)
    quantized: onnx.ModelProto = quantizer.model.model
    quantized.doc_string = f"{model.doc_string} [{int4.label}]"
    return quantized


def int4_weight(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int, n: int,
                block_size: int) -> np.ndarray:
    """The float32 [K, N] weight a ``MatMulNBits`` (4 bits) holds: ``b`` uint8 [N, blocks, block_size / 2] (two
    values a byte, the low nibble first), ``scales`` [N, blocks], ``zero_points`` uint8 [N, ceil(blocks / 2)] packed
    the same way (None: 8); w = (q - zero_point) * scale."""
    blocks = b.shape[1]
    q = np.empty((n, blocks, block_size), dtype=np.int32)
    q[..., 0::2] = b & 0x0F
    q[..., 1::2] = b >> 4
    if zero_points is None:
        zp = np.full((n, blocks), 8, dtype=np.int32)
    else:
        packed = zero_points.reshape(n, -1)
        zp = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)[:, :blocks].astype(np.int32)
    w = (q - zp[..., None]).astype(np.float32) * scales.reshape(n, blocks, 1).astype(np.float32)
    weight: np.ndarray = np.ascontiguousarray(w.reshape(n, blocks * block_size)[:, :k].T)
    return weight


def dequantize_int4(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float32 twin of an int4 export: each 4-bit ``MatMulNBits`` (in subgraphs too: optimum's merged decoder)
    back to a MatMul over the weight it holds (`int4_weight`), named as before quantization, its weight an
    initializer of the main graph. What the int4 export computes at ``accuracy_level`` 0, to float32 rounding: the
    reference its logits are checked against (random test weights lose too much to int4 for the float32 export's
    logits to be one)."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    inits = {t.name: t for t in model.graph.initializer}
    made: dict[str, onnx.TensorProto] = {}
    dropped: set[str] = set()
    _dequantize_graph(twin.graph, inits, made, dropped)
    kept = [t for t in twin.graph.initializer if t.name not in dropped]
    del twin.graph.initializer[:]
    twin.graph.initializer.extend(kept + list(made.values()))
    twin.doc_string = f"{model.doc_string} [dequantized]"
    return twin


def _dequantize_graph(graph: onnx.GraphProto, outer: dict[str, onnx.TensorProto], made: dict[str, onnx.TensorProto],
                      dropped: set[str]) -> None:
    """Replace ``graph``'s MatMulNBits nodes (and its subgraphs') in place; ``outer``: the initializers in scope;
    ``made``: the float weights made (by name, one per quantized weight); ``dropped``: the int4 tensors replaced."""
    from onnx import helper, numpy_helper

    inits = outer | {t.name: t for t in graph.initializer}
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                _dequantize_graph(sub, inits, made, dropped)
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            graph.node.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("bits", 4) != 4 or any(node.input[4:]):
            raise ValueError(f"{node.name}: only 4-bit MatMulNBits without g_idx or bias are dequantized")
        names = [*node.input[1:4], "", ""][:3]
        if not names[0] or not names[1] or names[0] not in inits or names[1] not in inits:
            raise ValueError(f"{node.name}: MatMulNBits whose weight or scales are not initializers")
        weight_name = names[0].removesuffix("_Q4")
        if weight_name not in made:
            zero_points = numpy_helper.to_array(inits[names[2]]) if names[2] else None
            made[weight_name] = numpy_helper.from_array(int4_weight(
                numpy_helper.to_array(inits[names[0]]), numpy_helper.to_array(inits[names[1]]), zero_points,
                attrs["K"], attrs["N"], attrs["block_size"]), weight_name)
        dropped.update(name for name in names if name)
        graph.node.append(helper.make_node("MatMul", [node.input[0], weight_name], list(node.output),
                                           name=node.name.removesuffix("_Q4")))


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in float16: weights, activations and the float inputs and outputs (past, present, logits); integer
    inputs unchanged. Values beyond float16's range are clamped to it (a float32-lowest mask value becomes
    -65504)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the converter changes the model it is given
    half: onnx.ModelProto = convert_float_to_float16(copy, keep_io_types=False, disable_shape_infer=True)
    half.doc_string = f"{model.doc_string} [fp16]"
    return half
