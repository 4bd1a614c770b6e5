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
- rotary (``do_rotary``, rotate-half) from the cos / sin caches gathered at those positions, on q and k, written as
  Hugging Face writes it (the plug-in fuses that into RoPE nodes);
- present = Concat(the past, new) on the sequence axis: the state grows by S rows a run;
- the KV heads repeated for the query heads (Unsqueeze / bidirectional Broadcast / Reshape, the pattern of Hugging
  Face's repeat_kv), and ScaledDotProductAttention with a boolean mask: key t is seen by the query at position p iff
  t <= p (key t holds position t).

That is the pattern OpenVINO's CPU plug-in fuses with the cache kept in place (its "stateful SDPA": ReadValue ->
Gather by a beam index -> Concat -> ScaledDotProductAttention, Assign fed by the Concat, the ReadValue with an initial
value; optimum-intel's IR has it): fused, a step appends its rows to the cache where it lies; with anything else
between the ReadValue and the Concat (a Slice) the plug-in decomposes the attention and copies the cache twice a step
(SmolLM2-135M fp32: 0 fused attentions of 30, decode 0.56x OpenVINO GenAI's). So the past is never cut in the graph:
a run must start at the rows the state holds (``position`` = its length), and the host cuts the state for a run from
an earlier position (a new prompt, a rewind: ``Generator``, with the stream's reset / set_state). A run at any other
position fails, naming the check (``POSITION_CHECK``: an Add whose shapes only match when they are equal, ahead of
every attention, so the state is untouched), never wrong logits. The cache's precision is the past's own
(``KV_CACHE_PRECISION`` in the IR's runtime options: the plug-in's default quantizes it to u8 and moves logits by
~0.03); a runner's own engine options override it, and its check against the export sees that.

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
from openvino.op import assign, read_value
from openvino.op.util import Variable, VariableInfo

UNCONVERTED = 3  # exit status: operators the frontend did not convert (their JSON on stdout)
_FRAMEWORK_NODES = ("ONNXFrameworkNode", "ONNXSubgraphFrameworkNode", "NotSupportedONNXNode")
_GQA_INPUTS = 9  # query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos, sin
# the growing form's check that a run starts at the rows the state holds: the name OpenVINO's error gives
POSITION_CHECK = "position_is_not_the_rows_the_state_holds__reset_or_cut_the_state_first"


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


def _position_mask(model: ov.Model, held_by: list[str]) -> None:
    """Input ``position`` int64 [1] in place of ``attention_mask``: the mask computed as position + S ones, from a
    Range comparison (the static form's rule: no ConstantOfShape), once ``position`` is checked to be the rows each
    state ``held_by`` (the past inputs, made variables later) holds: Range(0, 2 + min(max |position - rows|, 1)) +
    [0, 0] has matching shapes only where they are all equal (the CPU plug-in does not check a Reshape's element
    count at run time, but fails an Add of shapes [2] and [3]; the min keeps a wild position from asking for a
    Range of its size)."""
    mask = model.input("attention_mask")
    position = ops.parameter([1], ov.Type.i64, name="position")
    position.output(0).get_tensor().set_names({"position"})
    held = ops.concat([ops.gather(ops.shape_of(model.input(name), "i64"), _const([2]), _const(0))
                       for name in held_by], 0)  # [pasts]
    off = ops.minimum(ops.reduce_max(ops.abs(ops.subtract(held, position)), _const([0]), False), _const(1))
    span = ops.add(ops.range(_const(0), ops.add(off, _const(2)), _const(1), "i64"), _const([0, 0]),
                   name=POSITION_CHECK)
    checked = ops.add(position, ops.reduce_min(span, _const([0]), True))  # position + 0, after the check
    ids = model.input("input_ids")
    s = ops.gather(ops.shape_of(ids, "i64"), _const([1]), _const(0))
    total = ops.squeeze(ops.add(checked, s), _const([0]))
    rows = ops.range(_const(0), total, _const(1), "i64")
    ones = ops.convert(ops.less(rows, total), mask.get_element_type())
    computed = ops.unsqueeze(ones, _const([0]))
    for consumer in list(mask.get_target_inputs()):
        consumer.replace_source_output(computed.output(0))
    model.remove_parameter(mask.get_node())
    model.add_parameters([position])


def _last_row_logits(model: ov.Model) -> None:
    """``logits`` the last row only, [1, 1, vocab], as the static form gives it (static_form): where a MatMul makes
    them (the LM head), its input cut to the last row, so that a prompt runs the head on one row, not on each (as
    optimum-intel's IR does: SmolLM2-135M's head is a fifth of its weights); else the logits cut."""
    result = model.output("logits").get_node()
    rows = result.input_value(0)
    head = rows.get_node()
    if (head.get_type_name() == "MatMul" and not head.get_attributes()["transpose_a"]
            and head.get_input_partial_shape(0).rank.get_length() == 3 and len(rows.get_target_inputs()) == 1):
        hidden = head.input_value(0)
        head.input(0).replace_source_output(_last_row(hidden).output(0))
        head.validate_and_infer_types()
        return
    last = _last_row(rows)
    rows.get_tensor().set_names(rows.get_names() - {"logits"})
    last.output(0).get_tensor().set_names({"logits"})
    result.input(0).replace_source_output(last.output(0))


def _last_row(rows: Any) -> Any:
    return ops.slice(rows, _const([-1]), _const([np.iinfo(np.int64).max]), _const([1]), _const([1]))


def _rotate_half(x: Any, cos: Any, sin: Any, d: int) -> Any:
    """x * cos + [-x2, x1] * sin over the head dim (cos, sin [B, 1, S, D]: each half's angles twice), as Hugging
    Face writes it: the pattern the plug-in fuses into one RoPE node (its RoPEFusionGPTNEOX)."""
    halves = ops.variadic_split(x, _const(3), _const([d // 2, d - d // 2]))
    minus = ops.constant(np.array(-1, x.get_element_type().to_dtype()))
    turned = ops.concat([ops.multiply(halves.output(1), minus), halves.output(0)], -1)
    return ops.add(ops.multiply(x, cos), ops.multiply(turned, sin))


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
        cos, sin = (ops.unsqueeze(ops.gather(ops.concat([cache, cache], -1), positions, _const(0)), _const([1]))
                    for cache in (inputs[7], inputs[8]))  # [B, 1, S, D]
        q, k = _rotate_half(q, cos, sin, d), _rotate_half(k, cos, sin, d)
    # the past as the plug-in fuses it (see the module): Gather by a beam index (batch 1: row 0), Concat, no cut
    beam = ops.constant(np.array([0], np.int32))
    present_k = ops.concat([ops.gather(past_k, beam, _const(0)), k], 2)
    present_v = ops.concat([ops.gather(past_v, beam, _const(0)), v], 2)
    keys, values = present_k, present_v
    if heads != kv_heads:
        wide, merged = _const([1, 1, heads // kv_heads, 1, 1]), _const([0, heads, -1, d])
        keys, values = (ops.reshape(ops.broadcast(ops.unsqueeze(p, _const([2])), wide, broadcast_spec="BIDIRECTIONAL"),
                                    merged, True) for p in (present_k, present_v))
    # the keys' count from the positions, not from a ShapeOf of the Concat (a third consumer the fusion refuses): the
    # state holds exactly `first` rows (_position_mask's check)
    total = ops.add(ops.gather(first, _const([0]), _const(0)), s)
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


def _make_stateful_in_place(model: ov.Model, pairs: dict[str, str]) -> None:
    """Each past input a variable read by a ReadValue with an initial value (zero rows) and each present assigned to
    it: apply_make_stateful_transformation's ReadValue has no initial value, and the plug-in's fused attention fails
    to compile over one ("contains less parent edges than 0")."""
    for past, present in pairs.items():
        param, result = model.input(past).get_node(), model.output(present).get_node()
        info = VariableInfo()
        info.variable_id, info.data_shape, info.data_type = (past + present, param.get_partial_shape(),
                                                             param.get_element_type())
        variable = Variable(info)
        empty = [d.get_length() if d.is_static else 0 for d in param.get_partial_shape()]  # [1, Hkv, 0, D]
        read = read_value(ops.constant(np.zeros(empty, info.data_type.to_dtype())), variable)
        for consumer in list(param.output(0).get_target_inputs()):
            consumer.replace_source_output(read.output(0))
        value = result.input_value(0)
        sink = assign(value.get_node(), variable)  # (it takes a node: then pointed at the output itself)
        sink.input(0).replace_source_output(value)
        model.add_sinks([sink])
        model.remove_result(result)
        model.remove_parameter(param)


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
        _position_mask(model, list(pairs))
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
    if growing:
        # the fused attention keeps the cache at the past's own precision, not the plug-in's default u8 (see the
        # module); options given at compile override it
        cache_type = model.input(next(iter(pairs))).get_element_type().get_type_name()
        model.set_rt_info(cache_type, ["runtime_options", "KV_CACHE_PRECISION"])
        _make_stateful_in_place(model, pairs)
    else:
        apply_make_stateful_transformation(model, pairs)
    ov.save_model(model, target, compress_to_fp16=False)
    return 0


def main(argv: list[str]) -> int:
    source, target, pairs, form, dims = argv
    kv_heads, head_dim = json.loads(dims)
    return convert(source, target, json.loads(pairs), form == "growing", (kv_heads, head_dim))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
