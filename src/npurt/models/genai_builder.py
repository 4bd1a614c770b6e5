"""The test decoders of `npurt.models.decoders` in the layout ONNX Runtime GenAI's model builder writes
(``onnxruntime-genai``'s ``src/python/py/models/builders/base.py``, its Llama path, CPU): the form in which Phi,
Llama, Qwen and Mistral are published for onnxruntime-genai. Same `DecoderShape`, same seed, same weights as
`decoders.make_weights`: the logits equal the standard form's to float32 rounding.

- inputs ``input_ids`` int64 [batch_size, sequence_length], ``attention_mask`` int64 [batch_size,
  total_sequence_length], ``past_key_values.{i}.key`` / ``.value`` [batch_size, num_kv_heads, past_sequence_length,
  kv_cache_dim] (the head size named, not fixed: genai_config.json's ``head_size`` gives it); no ``position_ids``
  (the rotary embedding is fused into the attention, its positions come from the mask). Outputs ``logits``
  [batch_size, sequence_length, vocab_size] and ``present.{i}.key`` / ``.value``
  [batch_size, num_kv_heads, total_sequence_length, kv_cache_dim], the attention node's own outputs.
- nodes as the builder names and writes them: a Gather embedding; ``SimplifiedLayerNormalization`` (ONNX domain, as
  the builder emits it; ONNX Runtime implements it) for the first norm, then ``SkipSimplifiedLayerNormalization``
  (com.microsoft; output 3 = the residual sum, the next norm's root input) for every later one; Q / K / V MatMuls
  (``packed_qkv``: one MatMul over the concatenated weights feeding the attention's query, key and value empty);
  com.microsoft ``GroupQueryAttention`` (``do_rotary=1``, ``rotary_interleaved=0``, ``cos_cache`` / ``sin_cache``
  [context_length, head_size / 2] initializers); the SwiGLU MLP as Sigmoid / Mul; the lm_head MatMul.
- the mask subgraph ``/model/attn_mask_reformat/attn_mask_subgraph``: ``seqlens_k`` = Cast(ReduceSum(attention_mask,
  axes [1], keepdims 0) - 1, int32), ``total_sequence_length`` = Cast(Gather(Shape(attention_mask), 1), int32).
- opset 21 (+ com.microsoft 1), IR version 10, as the builder writes. onnx.checker does not know the ONNX-domain
  ``SimplifiedLayerNormalization``: the model is checked by loading it in ONNX Runtime instead.

GroupQueryAttention writes the S new key/value rows at ``seqlens_k + 1 - S``; with the past and present bound to one
buffer of max_length rows it does so in place (``genai_config.json``: ``past_present_share_buffer`` true, as the
builder writes it for GroupQueryAttention). Fed a past of ``past_sequence_length`` rows instead, the present is the
past plus the new rows, as a Concat model's. ONNX Runtime's CPU kernel with ``do_rotary`` needs head_size % 16 == 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .decoders import (
    ATTENTION_MASK,
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    EXTERNAL_DATA_FILE,
    GENAI_CONFIG,
    INPUT_IDS,
    LOGITS,
    MODEL_FILE,
    PAD_TOKEN_ID,
    PAST_KEY,
    PAST_VALUE,
    POSITION_IDS,
    PRESENT_KEY,
    PRESENT_VALUE,
    RMS_EPS,
    DecoderShape,
    make_weights,
    rope_caches,
    shape_of,
)

BUILDER_OPSET = 21
BUILDER_IR_VERSION = 10
MS_DOMAIN = "com.microsoft"
COS_CACHE, SIN_CACHE = "cos_cache", "sin_cache"
MASK_SUBGRAPH = "/model/attn_mask_reformat/attn_mask_subgraph"
SEQLENS_K = f"{MASK_SUBGRAPH}/Sub/Cast/output_0"
TOTAL_SEQ_LEN = f"{MASK_SUBGRAPH}/Gather/Cast/output_0"

HEAD_SIZE_DIM = "kv_cache_dim"  # the builder's name for the cache's head size dim


def rotary_head_ok(shape: DecoderShape) -> bool:
    """Whether ONNX Runtime's CPU GroupQueryAttention runs ``shape`` with the fused rotary (head_size % 16 == 0)."""
    return shape.head_dim % 16 == 0


class _BuilderGraph:
    """Nodes named as the builder names them (``/model/...``), each output ``{name}/output_{k}``; initializers;
    constants as ``/model/constants/{TYPE}/{value}`` initializers, made once."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._constants: set[str] = set()

    def op(self, op_type: str, name: str, inputs: list[str], n_outputs: int = 1, domain: str | None = None,
           **attrs: Any) -> list[str]:
        outputs = [f"{name}/output_{k}" for k in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs

    def node(self, op_type: str, name: str, inputs: list[str], outputs: list[str], domain: str | None = None,
             **attrs: Any) -> None:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs))

    def weight(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def int64(self, value: int | list[int]) -> str:
        text = str(value) if isinstance(value, int) else f"[{', '.join(str(v) for v in value)}]"
        name = f"/model/constants/INT64/{text}"
        if name not in self._constants:
            self._constants.add(name)
            self.weight(name, np.array(value, dtype=np.int64))
        return name


def _mask_subgraph(g: _BuilderGraph) -> None:
    """seqlens_k and total_sequence_length from attention_mask, as the builder's
    make_attention_mask_reformatting_for_gqa writes them."""
    reduce_sum = g.op("ReduceSum", f"{MASK_SUBGRAPH}/ReduceSum", [ATTENTION_MASK, g.int64([1])], keepdims=0)[0]
    sub = g.op("Sub", f"{MASK_SUBGRAPH}/Sub", [reduce_sum, g.int64([1])])[0]
    g.op("Cast", f"{MASK_SUBGRAPH}/Sub/Cast", [sub], to=TensorProto.INT32)
    shape = g.op("Shape", f"{MASK_SUBGRAPH}/Shape", [ATTENTION_MASK])[0]
    gather = g.op("Gather", f"{MASK_SUBGRAPH}/Gather", [shape, g.int64(1)], axis=0)[0]
    g.op("Cast", f"{MASK_SUBGRAPH}/Gather/Cast", [gather], to=TensorProto.INT32)


def build_builder_model(shape: DecoderShape | str, seed: int = 0, *, packed_qkv: bool = False,
                        rotary_node: bool = False, local_window_size: int = -1,
                        rotary_rows: int | None = None) -> onnx.ModelProto:
    """The decoder in the model builder's layout (weights inline, float32): see the module's description.
    ``packed_qkv``: one Q/K/V MatMul feeding GroupQueryAttention's query input (the builder's default where the three
    projections share a dtype), else three. ``rotary_node``: the rotary embedding as com.microsoft
    ``RotaryEmbedding`` nodes on Q and K before the attention (``do_rotary=0``), from a ``position_ids`` input, as
    the builder writes it where the attention does not fuse it. ``local_window_size``: GroupQueryAttention's sliding
    window (-1: none), as the builder writes for models with ``sliding_window``. ``rotary_rows``: the cos / sin
    caches' rows (default the context length; fewer make an export whose tables end before its context, the bad
    input a runtime must refuse before it runs)."""
    shape = shape_of(shape) if isinstance(shape, str) else shape
    if rotary_node and packed_qkv:
        raise ValueError("packed_qkv needs the rotary fused into the attention (the builder packs only then)")
    if local_window_size == 0 or local_window_size < -1:
        raise ValueError(f"local_window_size must be -1 (none) or positive, got {local_window_size}")
    w = make_weights(shape, seed)
    g = _BuilderGraph()
    cos, sin = rope_caches(shape)
    if rotary_rows is not None:
        if not 0 < rotary_rows <= shape.context_length:
            raise ValueError(f"rotary_rows must be 1..{shape.context_length}, got {rotary_rows}")
        cos, sin = cos[:rotary_rows], sin[:rotary_rows]
    embed = g.weight("model.embed_tokens.weight", w["model.embed_tokens.weight"])
    x = g.op("Gather", "/model/embed_tokens/Gather", [embed, INPUT_IDS])[0]
    _mask_subgraph(g)
    g.weight(COS_CACHE, cos)
    g.weight(SIN_CACHE, sin)

    inputs = [helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"])]
    if rotary_node:
        inputs.append(helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]))
    outputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["batch_size", "sequence_length", shape.vocab])]
    # the head size's dim is named, not fixed, as the builder (0.18) writes it: genai_config.json's head_size gives it
    past_dims: list[str | int | None] = ["batch_size", shape.kv_heads, "past_sequence_length", HEAD_SIZE_DIM]
    present_dims: list[str | int | None] = ["batch_size", shape.kv_heads, "total_sequence_length", HEAD_SIZE_DIM]

    residual, skip = x, ""  # the running residual (root input) and the branch output to add to it (skip input)
    for i in range(shape.layers):
        p, n = f"model.layers.{i}.", f"/model/layers.{i}"
        inputs += [helper.make_tensor_value_info(PAST_KEY % i, TensorProto.FLOAT, past_dims),
                   helper.make_tensor_value_info(PAST_VALUE % i, TensorProto.FLOAT, past_dims)]
        outputs += [helper.make_tensor_value_info(PRESENT_KEY % i, TensorProto.FLOAT, present_dims),
                    helper.make_tensor_value_info(PRESENT_VALUE % i, TensorProto.FLOAT, present_dims)]
        norm_w = g.weight(p + "input_layernorm.weight", w[p + "input_layernorm.weight"])
        if i == 0:
            h = g.op("SimplifiedLayerNormalization", f"{n}/input_layernorm/LayerNorm", [residual, norm_w],
                     axis=-1, epsilon=RMS_EPS, stash_type=1)[0]
        else:
            h, residual = _skip_norm(g, f"{n}/input_layernorm", residual, skip, norm_w)

        if packed_qkv:
            qkv = np.concatenate([w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"],
                                  w[p + "self_attn.v_proj.weight"]], axis=1)
            name = f"{n}/attn/qkv_proj/MatMul"
            q = g.op("MatMul", name, [h, g.weight(f"{name[1:].replace('/', '.')}.weight", qkv)])[0]
            k = v = ""
        else:
            q, k, v = (_matmul(g, f"{n}/attn/{proj}_proj/MatMul", h, w[f"{p}self_attn.{proj}_proj.weight"])
                       for proj in ("q", "k", "v"))
        caches = [COS_CACHE, SIN_CACHE]
        if rotary_node:  # [B, S, N * H] in and out; num_heads 0 and rotary_embedding_dim 0: the full head rotated
            q, k = (g.op("RotaryEmbedding", f"{n}/attn/{which}_rotary/RotaryEmbedding",
                         [x_in, POSITION_IDS, COS_CACHE, SIN_CACHE], domain=MS_DOMAIN, interleaved=0, num_heads=0,
                         rotary_embedding_dim=0)[0] for which, x_in in (("q", q), ("k", k)))
            caches = ["", ""]
        gqa = f"{n}/attn/GroupQueryAttention"
        g.node("GroupQueryAttention", gqa,
               [q, k, v, PAST_KEY % i, PAST_VALUE % i, SEQLENS_K, TOTAL_SEQ_LEN, *caches],
               [f"{gqa}/output_0", PRESENT_KEY % i, PRESENT_VALUE % i], domain=MS_DOMAIN,
               num_heads=shape.heads, kv_num_heads=shape.kv_heads, scale=1.0 / math.sqrt(shape.head_dim),
               local_window_size=local_window_size, softcap=0.0, do_rotary=0 if rotary_node else 1,
               rotary_interleaved=0)
        skip = _matmul(g, f"{n}/attn/o_proj/MatMul", f"{gqa}/output_0", w[p + "self_attn.o_proj.weight"])

        norm_w = g.weight(p + "post_attention_layernorm.weight", w[p + "post_attention_layernorm.weight"])
        h, residual = _skip_norm(g, f"{n}/post_attention_layernorm", residual, skip, norm_w)
        gate = _matmul(g, f"{n}/mlp/gate_proj/MatMul", h, w[p + "mlp.gate_proj.weight"])
        up = _matmul(g, f"{n}/mlp/up_proj/MatMul", h, w[p + "mlp.up_proj.weight"])
        sigmoid = g.op("Sigmoid", f"{n}/mlp/act_fn/Sigmoid", [gate])[0]
        act = g.op("Mul", f"{n}/mlp/act_fn/Mul", [gate, sigmoid])[0]
        product = g.op("Mul", f"{n}/mlp/Mul", [act, up])[0]
        skip = _matmul(g, f"{n}/mlp/down_proj/MatMul", product, w[p + "mlp.down_proj.weight"])

    final_w = g.weight("model.norm.weight", w["model.norm.weight"])
    h = g.op("SkipSimplifiedLayerNormalization", f"/model/layers.{shape.layers}/final_norm_layernorm/SkipLayerNorm",
             [residual, skip, final_w], domain=MS_DOMAIN, epsilon=RMS_EPS)[0]
    g.node("MatMul", "/lm_head/MatMul", [h, g.weight("lm_head.MatMul.weight", w["lm_head.weight"])], [LOGITS])

    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, g.initializers)
    model = helper.make_model(graph, producer_name="onnxruntime-genai", producer_version="npurt-test",
                              opset_imports=[helper.make_opsetid("", BUILDER_OPSET),
                                             helper.make_opsetid(MS_DOMAIN, 1)],
                              ir_version=BUILDER_IR_VERSION)
    model.doc_string = (f"npurt test decoder, ONNX Runtime GenAI model-builder layout (random weights, seed {seed}, "
                        f"packed_qkv={packed_qkv}, rotary_node={rotary_node}, local_window_size={local_window_size}): "
                        + json.dumps(shape.__dict__, sort_keys=True))
    return model


def _matmul(g: _BuilderGraph, name: str, x: str, weight: np.ndarray) -> str:
    """A MatMul node with its weight initializer named as the builder names it (``model.layers.0.attn.q_proj.
    MatMul.weight``)."""
    return g.op("MatMul", name, [x, g.weight(f"{name[1:].replace('/', '.')}.weight", weight)])[0]


def _skip_norm(g: _BuilderGraph, prefix: str, residual: str, skip: str, weight: str) -> tuple[str, str]:
    """SkipSimplifiedLayerNormalization: the normalised sum (output 0) and the sum itself (output 3, the next
    residual)."""
    name = f"{prefix}/SkipLayerNorm"
    out0, out3 = f"{prefix}/output_0", f"{prefix}/output_3"
    g.node("SkipSimplifiedLayerNormalization", name, [residual, skip, weight], [out0, "", "", out3],
           domain=MS_DOMAIN, epsilon=RMS_EPS)
    return out0, out3


def builder_genai_config(shape: DecoderShape, *, eos_token_id: int | list[int] = EOS_TOKEN_ID,
                         filename: str = MODEL_FILE, position_ids: bool = False) -> dict[str, Any]:
    """genai_config.json as the builder writes it for this model on CPU: type "llama", ``position_ids`` only where
    the rotary embedding is a node of its own, ``past_present_share_buffer`` true (GroupQueryAttention), the
    builder's search defaults."""
    inputs = {"input_ids": INPUT_IDS, "attention_mask": ATTENTION_MASK,
              "past_key_names": PAST_KEY, "past_value_names": PAST_VALUE}
    if position_ids:
        inputs["position_ids"] = POSITION_IDS
    return {
        "model": {
            "bos_token_id": BOS_TOKEN_ID,
            "context_length": shape.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": shape.head_dim,
                "hidden_size": shape.hidden,
                "inputs": inputs,
                "outputs": {"logits": LOGITS, "present_key_names": PRESENT_KEY,
                            "present_value_names": PRESENT_VALUE},
                "num_attention_heads": shape.heads,
                "num_hidden_layers": shape.layers,
                "num_key_value_heads": shape.kv_heads,
            },
            "eos_token_id": eos_token_id,
            "pad_token_id": PAD_TOKEN_ID,
            "type": "llama",
            "vocab_size": shape.vocab,
        },
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
                   "max_length": shape.context_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 50, "top_p": 1.0},
    }


def save_model(model: onnx.ModelProto, path: Path, external_data: str | None = None) -> Path:
    """Write ``model`` to ``path``; ``external_data``: the weights go to that file beside it (its name, e.g.
    ``model.onnx.data`` or optimum's ``model.onnx_data``), the graph stays in ``path``."""
    if external_data is None:
        path.write_bytes(model.SerializeToString())
    else:
        (path.parent / external_data).unlink(missing_ok=True)  # onnx appends to a data file that is there
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=external_data, size_threshold=1024)
    return path


def build_builder_decoder(folder: str | Path, shape: DecoderShape | str, seed: int = 0, *, packed_qkv: bool = False,
                          rotary_node: bool = False, local_window_size: int = -1, external_data: bool | str = False,
                          eos_token_id: int | list[int] = EOS_TOKEN_ID) -> Path:
    """Write the builder-form ``model.onnx`` (`build_builder_model`'s options) and its ``genai_config.json`` into
    ``folder`` (made if missing); returns the model's path. ``external_data``: True (``model.onnx.data``) or the data
    file's name."""
    shape = shape_of(shape) if isinstance(shape, str) else shape
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = EXTERNAL_DATA_FILE if external_data is True else (external_data or None)
    model = build_builder_model(shape, seed, packed_qkv=packed_qkv, rotary_node=rotary_node,
                                local_window_size=local_window_size)
    path = save_model(model, folder / MODEL_FILE, data)
    config = builder_genai_config(shape, eos_token_id=eos_token_id, position_ids=rotary_node)
    (folder / GENAI_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path
