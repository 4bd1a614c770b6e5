"""The test decoders as Hugging Face optimum (and transformers.js) export them: no genai_config.json, the model's
settings in ``config.json`` and ``generation_config.json``, and either

- one ``model.onnx`` with the past as inputs (the standard form of `npurt.models.decoders`: optimum's layout), or
- a merged decoder, ``decoder_model_merged.onnx``, as optimum's ``merge_decoders`` writes it: the decoder without
  past and the decoder with past joined by one ``If`` node (``optimum::if``) on a bool input ``use_cache_branch``
  [1]; its then-branch is the with-past graph, its else-branch the no-past graph (the present = the prompt's own
  keys and values); the inputs are the union of both (the past inputs are read by the then-branch only, a caller
  feeds them empty with ``use_cache_branch`` false); the initializers of both, deduplicated, in the outer graph
  under names suffixed ``_merged``; the branches hold nodes only.

Same weights (`decoders.make_weights`) as every other form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper, numpy_helper

from .decoders import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    IR_VERSION,
    PAD_TOKEN_ID,
    PRESENT_KEY,
    PRESENT_VALUE,
    DecoderShape,
    build_model,
    hf_config,
)

MERGED_MODEL_FILE = "decoder_model_merged.onnx"
USE_CACHE_BRANCH = "use_cache_branch"
IF_NODE = "optimum::if"
HF_CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"


def without_past(with_past: onnx.ModelProto) -> onnx.ModelProto:
    """The no-past decoder of a standard-form (Concat) decoder: the past inputs gone, each present the new keys or
    values themselves (what an export without past computes; the mask's past length is then 0)."""
    past_names = {v.name for v in with_past.graph.input if v.name.startswith("past_key_values.")}
    presents = {PRESENT_KEY % i for i in range(len(past_names))} | {PRESENT_VALUE % i for i in range(len(past_names))}
    model = onnx.ModelProto()
    model.CopyFrom(with_past)
    del model.graph.node[:]
    for node in with_past.graph.node:
        if node.op_type == "Concat" and node.output[0] in presents:
            if node.input[0] not in past_names:
                raise ValueError(f"{node.name}: a present's Concat that does not start with a past input")
            model.graph.node.append(helper.make_node("Identity", [node.input[1]], list(node.output), name=node.name))
        else:
            if past_names & set(node.input):
                raise ValueError(f"{node.name} reads a past input beyond the present's Concat")
            model.graph.node.append(node)
    kept = [v for v in with_past.graph.input if v.name not in past_names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model


def merge_decoders(decoder: onnx.ModelProto, decoder_with_past: onnx.ModelProto,
                   graph_name: str = "merged") -> onnx.ModelProto:
    """One model with an If on ``use_cache_branch``, as optimum's merge_decoders makes it (see the module's
    description); both decoders must have the same outputs (names and element types, in order) and opset."""
    outputs_a = [(v.name, v.type.tensor_type.elem_type) for v in decoder.graph.output]
    outputs_b = [(v.name, v.type.tensor_type.elem_type) for v in decoder_with_past.graph.output]
    if outputs_a != outputs_b:
        raise ValueError(f"the decoders' outputs differ: {outputs_a} and {outputs_b}")
    if list(decoder.opset_import) != list(decoder_with_past.opset_import):
        raise ValueError("the decoders' opsets differ")
    inputs: list[onnx.ValueInfoProto] = []
    for v in [*decoder.graph.input, *decoder_with_past.graph.input]:
        if v.name not in {i.name for i in inputs}:
            inputs.append(v)

    # initializers with the same type, dims and bytes become one, renamed <a name>_<graph_name> (as optimum does)
    initializers: dict[tuple[int, tuple[int, ...], bytes], onnx.TensorProto] = {}
    renamed: list[dict[str, str]] = []
    for model in (decoder, decoder_with_past):
        names: dict[str, str] = {}
        for t in model.graph.initializer:
            key = (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
            if key not in initializers:
                shared = onnx.TensorProto()
                shared.CopyFrom(t)
                shared.name = f"{t.name}_{graph_name}"
                initializers[key] = shared
            names[t.name] = initializers[key].name
        renamed.append(names)

    def branch(model: onnx.ModelProto, names: dict[str, str], name: str) -> onnx.GraphProto:
        nodes = []
        for node in model.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            for k, value in enumerate(copy.input):
                copy.input[k] = names.get(value, value)
            nodes.append(copy)
        return helper.make_graph(nodes, name, [], list(model.graph.output))

    no_past = branch(decoder, renamed[0], "no_past")
    with_past = branch(decoder_with_past, renamed[1], "with_past")
    use_cache = helper.make_tensor_value_info(USE_CACHE_BRANCH, TensorProto.BOOL, [1])
    if_node = helper.make_node("If", [USE_CACHE_BRANCH], [v.name for v in decoder_with_past.graph.output],
                               name=IF_NODE, then_branch=with_past, else_branch=no_past)
    graph = helper.make_graph([if_node], graph_name, [*inputs, use_cache], list(decoder_with_past.graph.output),
                              list(initializers.values()))
    merged = helper.make_model(graph, producer_name="optimum-onnx", opset_imports=list(decoder.opset_import),
                               ir_version=decoder.ir_version)
    merged.doc_string = decoder_with_past.doc_string
    return merged


def build_merged_model(shape: DecoderShape, seed: int = 0) -> onnx.ModelProto:
    """The merged decoder (float32) of ``shape``, checked by onnx.checker."""
    with_past = build_model(shape, seed)
    merged = merge_decoders(without_past(with_past), with_past)
    merged.ir_version = IR_VERSION
    onnx.checker.check_model(merged)
    return merged


def generation_config(eos_token_id: int | list[int] = EOS_TOKEN_ID) -> dict[str, Any]:
    """generation_config.json: the special tokens, greedy."""
    return {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": eos_token_id, "pad_token_id": PAD_TOKEN_ID,
            "do_sample": False}


def write_hf_configs(folder: Path, shape: DecoderShape, eos_token_id: int | list[int] = EOS_TOKEN_ID) -> None:
    """config.json (`decoders.hf_config`) and generation_config.json into ``folder``."""
    (folder / HF_CONFIG).write_text(json.dumps(hf_config(shape) | {"eos_token_id": eos_token_id}, indent=2,
                                               sort_keys=True) + "\n")
    (folder / GENERATION_CONFIG).write_text(json.dumps(generation_config(eos_token_id), indent=2,
                                                       sort_keys=True) + "\n")
