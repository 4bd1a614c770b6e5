"""The child process of ``openvino_form``: a decoder export converted by OpenVINO's ONNX frontend, edited, made
stateful and saved as IR. Run as
``python -m npurt.generate.openvino_convert SOURCE TARGET PAIRS_JSON FORM DIMS_JSON`` (FORM: ``static`` or
``growing``; DIMS_JSON: the cache's [kv_heads, head_dim]); exit status 3 with a JSON list of reasons on stdout where
operators did not convert (the frontend's report, naming them); 2 with one line on stderr where the form cannot be
made.

The growing form replaces each GroupQueryAttention by standard operations, as ONNX Runtime computes it: the IR
reader does not take OpenVINO's own GroupQueryAttention (an internal operation: "unsupported opset: extension"), so
an IR holding it could not be read back. Per node, with q [B, H, S, D], k / v [B, Hkv, S, D] (the frontend's split),
the past [B, Hkv, P, D], ``seqlens_k`` [B]:

- the new tokens' positions are seqlens_k + 1 - S + [0 .. S-1] (ONNX Runtime's rule; ``total_sequence_length`` is
  ignored, as OpenVINO's own conversion does);
- rotary (``do_rotary``, rotate-half) from the cos / sin caches gathered at those positions, on q and k;
- present = Concat(the past's first seqlens_k + 1 - S rows, new) on the sequence axis: the state grows by S rows a
  run, and a run from an earlier position (a new prompt, a rewind) drops the rows after it;
- the KV heads repeated for the query heads (Unsqueeze / Broadcast / Reshape, the pattern of Hugging Face's
  repeat_kv), and ScaledDotProductAttention with a boolean mask: key t is seen by the query at position p iff
  t <= p (key t holds position t).

Other settings of the node (interleaved rotary, a local window, smooth softmax, a quantized cache, extra inputs) are
refused naming them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import openvino as ov
from openvino import opset13 as ops
from openvino._offline_transformations import apply_make_stateful_transformation
from openvino.frontend import FrontEndManager

UNCONVERTED = 3  # exit status: operators the frontend did not convert (their JSON on stdout)
_FRAMEWORK_NODES = ("ONNXFrameworkNode", "ONNXSubgraphFrameworkNode", "NotSupportedONNXNode")
_GQA_INPUTS = 9  # query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos, sin


class Refused(Exception):
    """An operator's settings that the growing form does not take."""


def _unconverted(frontend: Any, model: ov.Model, source: str) -> list[str]:
    """What the frontend left unconverted, as its own report says it ("No conversion rule found for operations:
    com.microsoft.X", "Conversion is failed for: ..."): a framework node's own attributes may name no operator."""
    roots = _failing_first(model)
    if not roots:
        return []
    named = _onnx_names(source, roots)
    types = {name.rpartition(".")[2] for name in named}
    try:
        frontend.convert(frontend.load(source))
    except Exception as e:  # noqa: BLE001 - the report comes as the conversion's error
        text = str(e)
        summary = text.split("Summary:", 1)[1] if "Summary:" in text else ""
        lines = []
        for line in summary.splitlines():
            if not line.strip().startswith("--"):
                continue
            head, _, listed = line.strip().removeprefix("-- ").partition(": ")
            # the operators that fail themselves: one whose input comes from an unconverted one fails for that alone
            kept = [item for item in listed.split(", ") if item.split("-")[0].rpartition(".")[2] in types]
            if kept:
                lines.append(f"{head}: {', '.join(kept)}")
        if lines:
            return lines
    return [f"operations not converted: {', '.join(sorted(named))}"]


def _onnx_names(source: str, ops: list[Any]) -> set[str]:
    """domain.type of each framework node, from the ONNX graph (a framework node's own attributes may not read), by
    the node's name or its first output's; the friendly name where neither is found."""
    import onnx

    graph = onnx.load(source, load_external_data=False).graph
    types: dict[str, str] = {}
    for node in graph.node:
        name = f"{node.domain or 'ai.onnx'}.{node.op_type}"
        types.setdefault(node.name, name)
        if node.output:
            types.setdefault(node.output[0], name)
    return {types.get(op.get_friendly_name(), op.get_friendly_name()) for op in ops}


def _failing_first(model: ov.Model) -> list[Any]:
    """The unconverted (framework) nodes none of whose inputs come, directly or not, from another unconverted node:
    the frontend also fails a node it converts elsewhere when its input is an unconverted one's (the builder's int4
    embedding named the two normalizations after it)."""
    downstream: set[str] = set()
    roots = []
    for op in model.get_ordered_ops():
        fed = any(i.get_source_output().get_node().get_name() in downstream for i in op.inputs())
        if op.get_type_name() in _FRAMEWORK_NODES:
            if not fed:
                roots.append(op)
            downstream.add(op.get_name())
        elif fed:
            downstream.add(op.get_name())
    return roots


def _const(value: Any, dtype: Any = np.int64) -> Any:
    return ops.constant(np.array(value, dtype))


def _position_mask(model: ov.Model) -> None:
    """Input ``position`` int64 [1] in place of ``attention_mask``: the mask computed as position + S ones, from a
    Range comparison (the static form's rule: no ConstantOfShape)."""
    mask = model.input("attention_mask")
    position = ops.parameter([1], ov.Type.i64, name="position")
    position.output(0).get_tensor().set_names({"position"})
    ids = model.input("input_ids")
    s = ops.gather(ops.shape_of(ids, "i64"), _const([1]), _const(0))
    total = ops.squeeze(ops.add(position, s), _const([0]))
    rows = ops.range(_const(0), total, _const(1), "i64")
    ones = ops.convert(ops.less(rows, total), mask.get_element_type())
    computed = ops.unsqueeze(ones, _const([0]))
    for consumer in list(mask.get_target_inputs()):
        consumer.replace_source_output(computed.output(0))
    model.remove_parameter(mask.get_node())
    model.add_parameters([position])


def _last_row_logits(model: ov.Model) -> None:
    """``logits`` the last row only, [1, 1, vocab], as the static form gives it (static_form)."""
    result = model.output("logits").get_node()
    rows = result.input_value(0)
    last = ops.slice(rows, _const([-1]), _const([np.iinfo(np.int64).max]), _const([1]), _const([1]))
    rows.get_tensor().set_names(rows.get_names() - {"logits"})
    last.output(0).get_tensor().set_names({"logits"})
    result.input(0).replace_source_output(last.output(0))


def _rotate_half(x: Any, cos: Any, sin: Any) -> Any:
    halves = ops.split(x, _const(-1), 2)
    x1, x2 = halves.output(0), halves.output(1)
    return ops.concat([ops.subtract(ops.multiply(x1, cos), ops.multiply(x2, sin)),
                       ops.add(ops.multiply(x2, cos), ops.multiply(x1, sin))], -1)


def _decompose_gqa(op: Any) -> None:
    attrs = op.get_attributes()
    name = op.get_friendly_name()
    for key, plain in (("rotary_interleaved", False), ("smooth_softmax", False), ("local_window_size", -1),
                       ("kv_cache_bit_width", 0), ("sliding_window_cache", False)):
        if key in attrs and attrs[key] != plain:
            raise Refused(f"com.microsoft.GroupQueryAttention {name!r} with {key}={attrs[key]} (the growing form "
                          "takes rotate-half rotary, no window, no smooth softmax, an unquantized cache)")
    inputs = [op.input_value(i) for i in range(op.get_input_size())]
    for i, value in enumerate(inputs[_GQA_INPUTS:], _GQA_INPUTS):
        if value.get_node().get_type_name() != "Constant" or value.get_partial_shape() != ov.PartialShape([0]):
            raise Refused(f"com.microsoft.GroupQueryAttention {name!r} with its optional input {i} given")
    q, k, v, past_k, past_v, seqlens = inputs[:6]
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    head_dim = q.get_partial_shape()[3]
    if head_dim.is_dynamic:
        raise Refused(f"com.microsoft.GroupQueryAttention {name!r}: head size not fixed")
    d = head_dim.get_length()
    s = ops.gather(ops.shape_of(q, "i64"), _const([2]), _const(0))  # [1]
    first = ops.subtract(ops.add(ops.convert(seqlens, "i64"), _const(1)), s)  # [B]
    steps = ops.range(_const(0), ops.squeeze(s, _const([0])), _const(1), "i64")
    positions = ops.add(ops.unsqueeze(first, _const([1])), ops.unsqueeze(steps, _const([0])))  # [B, S]
    if attrs.get("do_rotary"):
        cos = ops.unsqueeze(ops.gather(inputs[7], positions, _const(0)), _const([1]))  # [B, 1, S, D/2]
        sin = ops.unsqueeze(ops.gather(inputs[8], positions, _const(0)), _const([1]))
        q, k = _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)
    # the past the state holds, cut to its first `first` rows: a run from an earlier position (a new prompt, a
    # rewind) overwrites what followed, as the static form's rows are (ONNX Runtime's GQA reads a larger past buffer
    # the same way: its first seqlens_k + 1 - S rows)
    kept = ops.gather(first, _const([0]), _const(0))  # [1] (batch 1)
    past_k, past_v = (ops.slice(p, _const([0]), kept, _const([1]), _const([2])) for p in (past_k, past_v))
    present_k = ops.concat([past_k, k], 2)
    present_v = ops.concat([past_v, v], 2)
    keys, values = present_k, present_v
    if heads != kv_heads:
        rep = heads // kv_heads
        shape = ops.shape_of(present_k, "i64")  # [B, Hkv, T, D]
        wide = ops.concat([ops.gather(shape, _const([0, 1]), _const(0)), _const([rep]),
                           ops.gather(shape, _const([2, 3]), _const(0))], 0)
        merged = _const([0, heads, -1, d])
        keys = ops.reshape(ops.broadcast(ops.unsqueeze(present_k, _const([2])), wide), merged, True)
        values = ops.reshape(ops.broadcast(ops.unsqueeze(present_v, _const([2])), wide), merged, True)
    total = ops.gather(ops.shape_of(present_k, "i64"), _const([2]), _const(0))
    rows = ops.range(_const(0), ops.squeeze(total, _const([0])), _const(1), "i64")  # [T]
    visible = ops.less_equal(ops.unsqueeze(rows, _const([0, 1, 2])),  # [1, 1, 1, T]
                             ops.unsqueeze(positions, _const([1, 3])))  # [B, 1, S, 1]
    scale = float(attrs.get("scale") or 0.0) or 1.0 / float(np.sqrt(d))
    attended = ops.scaled_dot_product_attention(q, keys, values, visible, _const(scale, q.get_element_type()
                                                                                 .to_dtype()), causal=False)
    out = ops.reshape(ops.transpose(attended, _const([0, 2, 1, 3])), _const([0, 0, heads * d]), True)
    for old, new in zip(op.outputs(), (out, present_k, present_v)):
        replacement = new.output(0)
        replacement.get_tensor().add_names(old.get_names())
        for consumer in list(old.get_target_inputs()):
            consumer.replace_source_output(replacement)


def decompose_group_query_attention(model: ov.Model) -> None:
    """Each GroupQueryAttention of ``model`` replaced by standard operations (see the module); Refused naming a
    setting they do not compute. (benchmarks/generate.py builds OpenVINO GenAI's IR of a builder-form export
    with it.)"""
    for op in [op for op in model.get_ordered_ops() if op.get_type_name() == "GroupQueryAttention"]:
        _decompose_gqa(op)


def convert(source: str, target: str, pairs: dict[str, str], growing: bool, cache_dims: tuple[int, int]) -> int:
    frontend = FrontEndManager().load_by_framework("onnx")
    try:
        model = frontend.convert_partially(frontend.load(source))
    except Exception as e:  # noqa: BLE001 - the frontend raises several types for a bad file
        lines = [line for line in str(e).splitlines() if line.strip()]
        print(f"cannot read ONNX model {source}: {lines[-1] if lines else type(e).__name__}", file=sys.stderr)
        return 2
    unconverted = _unconverted(frontend, model, source)
    if unconverted:
        print(json.dumps(unconverted))
        return UNCONVERTED
    frontend.normalize(model)
    if growing:
        _position_mask(model)
        _last_row_logits(model)
        # batch 1: the state starts as [1, Hkv, 0, D] (with the batch open it starts at batch 0 and the first Concat
        # fails); the heads and head size as the layout read them (the model builder names the head size's dim)
        for name in ("input_ids", *pairs):
            param = model.input(name).get_node()
            shape = param.get_partial_shape()
            shape[0] = 1
            if name != "input_ids":
                shape[1], shape[3] = cache_dims
            param.set_partial_shape(shape)
        try:
            decompose_group_query_attention(model)
        except Refused as e:
            print(json.dumps([str(e)]))
            return UNCONVERTED
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, pairs)
    ov.save_model(model, target, compress_to_fp16=False)
    return 0


def main(argv: list[str]) -> int:
    source, target, pairs, form, dims = argv
    kv_heads, head_dim = json.loads(dims)
    return convert(source, target, json.loads(pairs), form == "growing", (kv_heads, head_dim))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
