"""com.microsoft ``GatherBlockQuantized`` written in standard ONNX operators, for engines that do not convert it.

ONNX Runtime GenAI's model builder writes an int4 model's tied embedding as a GatherBlockQuantized over the
language-model head's own MatMulNBits weights (rows of packed 4-bit values, a float scale per block): OpenVINO's
ONNX frontend has no conversion for it, and refused the builder's default int4 folder. Its rows are gathered here
by the ids, then unpacked and scaled as ONNX Runtime's kernel does it (``contrib_ops/cpu/quantization/
gather_block_quantized.cc``): two 4-bit values a byte, the low nibble first; the value minus its zero point (8
where the node has none: the unsigned 4-bit middle) times its block's scale. The unpacking is float arithmetic on
values below 256 (Floor of x / 16, and x - 16 * that), exact, and every engine converts it.

Taken: ``bits`` 4, ``gather_axis`` 0, ``quantize_axis`` the last (the builder's embedding); other settings are
refused naming them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

    from .onnx_build import GraphBuilder

OP = "GatherBlockQuantized"
DOMAIN = "com.microsoft"
_PREFIX = "__npurt_block_gather"


def rewrite(model: onnx.ModelProto, weight_types: Mapping[str, int] | None = None) -> int:
    """Each GatherBlockQuantized of ``model``'s main graph replaced in place by standard operators (see the
    module); returns how many. ``weight_types``: the element types of initializers left out of a weightless model
    (the output takes the scales' type). ValueError naming a node whose settings are not the ones taken."""
    from onnx import TensorProto, helper

    from .onnx_build import GraphBuilder  # (only where a model is rewritten)

    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == OP and n.domain == DOMAIN]
    if not nodes:
        return 0
    types = {t.name: t.data_type for t in graph.initializer} | dict(weight_types or {})
    b = GraphBuilder(graph, _PREFIX)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
        gather_axis, quantize_axis = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
        if bits != 4 or gather_axis != 0 or quantize_axis not in (1, -1):
            raise ValueError(f"{DOMAIN}.{OP} {node.name!r} with bits={bits}, gather_axis={gather_axis}, "
                             f"quantize_axis={quantize_axis}: npurt writes it in standard operators for bits 4, "
                             "gather_axis 0 and the last quantize_axis (a 2-D table, as the model builder writes it)")
        data, indices, scales = node.input[0], node.input[1], node.input[2]
        zero_points = node.input[3] if len(node.input) > 3 and node.input[3] else ""
        b.nodes.clear()
        pairs = _unpacked(b, b.node("Gather", [data, indices], axis=0))  # [..., K/2, 2]
        scale = b.node("Unsqueeze", [b.node("Gather", [scales, indices], axis=0), b.const([-1])])  # [..., K/B, 1]
        lead = b.node("Shape", [indices])
        flat = b.node("Reshape", [pairs, b.node("Concat", [lead, b.const([-1, block])], axis=0)])  # [..., K/B, B]
        if zero_points:
            # (packed zero points: two a byte, as the values are)
            zero_pairs = _unpacked(b, b.node("Gather", [zero_points, indices], axis=0))
            zero_flat = b.node("Reshape", [zero_pairs, b.node("Concat", [lead, b.const([-1, 1])], axis=0)])
            centred = b.node("Sub", [flat, zero_flat])
        else:
            centred = b.node("Sub", [flat, b.const(np.array(8, np.float32))])
        scaled = b.node("Mul", [centred, b.node("Cast", [scale], to=TensorProto.FLOAT)])
        out = b.node("Reshape", [scaled, b.node("Concat", [lead, b.const([-1])], axis=0)])
        b.node("Cast", [out], node.output[0], to=types.get(scales, TensorProto.FLOAT))  # (the scales' type)
        replaced[id(node)] = list(b.nodes)
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        kept.extend(replaced.get(id(node), [node]))
    del graph.node[:]
    graph.node.extend(kept)
    return len(nodes)


def _unpacked(b: GraphBuilder, packed: str) -> str:
    """``packed`` (uint8, two 4-bit values a byte) as floats [..., 2]: the low nibble, then the high one."""
    from onnx import TensorProto

    rows = b.node("Cast", [packed], to=TensorProto.FLOAT)
    high = b.node("Floor", [b.node("Div", [rows, b.const(np.array(16, np.float32))])])
    low = b.node("Sub", [rows, b.node("Mul", [high, b.const(np.array(16, np.float32))])])
    return b.node("Concat", [b.node("Unsqueeze", [low, b.const([-1])]), b.node("Unsqueeze", [high, b.const([-1])])],
                  axis=-1)
