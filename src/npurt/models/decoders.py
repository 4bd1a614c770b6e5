"""Small Llama-style decoder-only ONNX models for tests, examples and benchmarks:
``python -m npurt.models.decoders OUT --shape NAME [--seed N] [--external-data] [--openvino]``.

Random weights from a fixed seed, standard ONNX ops only (no com.microsoft), in the layout of ONNX Runtime GenAI's
model builder and optimum's exports, so that onnxruntime-genai runs the folder as written:

- inputs ``input_ids`` int64 [batch_size, sequence_length]; ``attention_mask`` int64 [batch_size,
  total_sequence_length]; ``position_ids`` int64 [batch_size, sequence_length] (absent where the shape says
  ``has_position_ids=False``: the graph derives the positions itself as ``cumsum(attention_mask) - 1``, its last
  sequence_length entries, as some exports do); ``past_key_values.{i}.key`` / ``.value`` float32 [batch_size,
  num_kv_heads, past_sequence_length, head_size].
- outputs ``logits`` float32 [batch_size, sequence_length, vocab_size]; ``present.{i}.key`` / ``.value`` float32
  [batch_size, num_kv_heads, total_sequence_length, head_size], each the output of ``Concat(past, new, axis=2)``.
- the network: a Gather embedding; per layer RMSNorm (Pow / ReduceMean / Add / Sqrt / Div / Mul), Q / K / V MatMuls,
  rotary embeddings (rotate-half) from cos / sin caches of ``context_length`` rows gathered by position, the KV heads
  repeated for grouped-query attention by a Gather over the head axis (or, ``kv_repeat="expand"``, by Unsqueeze /
  Expand / Reshape as Hugging Face's ``repeat_kv`` exports), scores ``Q K^T / sqrt(head_dim)`` plus an
  additive mask, Softmax, the output projection, a SwiGLU MLP; the final RMSNorm and the lm_head MatMul.
- the mask is built in the graph from ``attention_mask`` (padding) and causality: key k is visible to query q iff
  ``attention_mask[k] == 1`` and ``k <= (total_sequence_length - sequence_length) + q``; a hidden key gets
  ``MASK_VALUE`` (float32's lowest, -3.4028235e38, as optimum's exports use) added before the Softmax.

`build_decoder` writes ``model.onnx`` (IR version 9, opset 17) and ``genai_config.json``; the same shape and seed give
the same bytes. `build_openvino_stateful` writes the stateful OpenVINO IR that OpenVINO GenAI's ``LLMPipeline`` takes
(it alone needs OpenVINO, imported when called). No weights are committed: build them where they are needed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 9
OPSET = 17
MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx.data"
GENAI_CONFIG = "genai_config.json"
OPENVINO_MODEL = "openvino_model.xml"
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
PAD_TOKEN_ID = 0
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
MASK_VALUE = float(np.finfo(np.float32).min)  # added to the score of a key a query must not see

# the names, as onnxruntime-genai's config spells them (%d: the layer)
INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"
PAST_KEY, PAST_VALUE = "past_key_values.%d.key", "past_key_values.%d.value"
PRESENT_KEY, PRESENT_VALUE = "present.%d.key", "present.%d.value"
BEAM_IDX = "beam_idx"  # OpenVINO GenAI's stateful models: the batch rows each past is gathered from


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of one decoder. ``heads`` query heads share ``kv_heads`` key/value heads (grouped-query attention
    where fewer; ``heads`` must be a multiple of ``kv_heads``); ``intermediate`` is the SwiGLU MLP's width."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context_length: int
    has_position_ids: bool = True
    kv_repeat: str = "gather"  # how KV heads are repeated for GQA: "gather" (one Gather) or "expand" (HF's repeat_kv)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"DecoderShape.{name} must be positive, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"DecoderShape: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.kv_repeat not in ("gather", "expand"):
            raise ValueError(f"DecoderShape: kv_repeat must be 'gather' or 'expand', got {self.kv_repeat!r}")
        if self.head_dim % 2:
            raise ValueError(f"DecoderShape: head_dim ({self.head_dim}) must be even (rotary embeddings)")
        if self.vocab <= max(BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID):
            raise ValueError(f"DecoderShape: vocab ({self.vocab}) must hold the special token ids")

    @property
    def parameters(self) -> int:
        """How many weights (float32 each), the rotary caches included."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * self.intermediate
        return self.layers * layer + 2 * self.vocab * h + h + self.context_length * self.head_dim


# Test shapes: a step is a fraction of a millisecond on one CPU core. "bench": compute dominates (about 75 MB).
SHAPES: dict[str, DecoderShape] = {
    "gqa": DecoderShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=176, vocab=512,
                        context_length=256),
    "mha": DecoderShape(layers=3, hidden=96, heads=4, kv_heads=4, head_dim=24, intermediate=256, vocab=640,
                        context_length=256),
    "nopos": DecoderShape(layers=2, hidden=128, heads=8, kv_heads=2, head_dim=16, intermediate=352, vocab=1024,
                          context_length=256, has_position_ids=False, kv_repeat="expand"),
    "bench": DecoderShape(layers=4, hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=1280, vocab=8192,
                          context_length=1024),
    # the ranges of issue 43 (vocab 300..8000, hidden 64..512, 1..4 layers, head_dim 16..64, 1..3 KV heads), each
    # head_dim a multiple of 16 (ONNX Runtime's CPU GroupQueryAttention with a fused rotary needs it)
    "v300": DecoderShape(layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=160, vocab=300,
                         context_length=256),
    "kv3": DecoderShape(layers=3, hidden=96, heads=6, kv_heads=3, head_dim=16, intermediate=256, vocab=2000,
                        context_length=256),
    "h64": DecoderShape(layers=2, hidden=256, heads=4, kv_heads=1, head_dim=64, intermediate=512, vocab=4000,
                        context_length=256),
    "l4v8k": DecoderShape(layers=4, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=8000,
                          context_length=256),
    "h512": DecoderShape(layers=1, hidden=512, heads=8, kv_heads=1, head_dim=64, intermediate=1024, vocab=1000,
                         context_length=256),
    # the benchmark decoder of the builder form (`npurt.models.decoder_forms`: preset names ending "-builder")
    "bench-builder": DecoderShape(layers=4, hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=1280,
                                  vocab=8000, context_length=1024),
}
TEST_SHAPES = ("gqa", "mha", "nopos")


def shape_of(name: str) -> DecoderShape:
    """The preset called ``name`` (a key of SHAPES); ValueError naming the presets otherwise."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"no decoder shape {name!r}; presets: {', '.join(SHAPES)}") from None


# ---------------------------------------------------------------------------------------------------------- weights
def make_weights(shape: DecoderShape, seed: int = 0) -> dict[str, np.ndarray]:
    """The named float32 weights of ``shape``, from numpy's PCG64 seeded with ``seed``, in a fixed order. Scaled so
    that activations stay near unit size and the logits spread over a few units (greedy picks are rarely near-ties).
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    h, q, kv, f = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate

    def normal(rows: int, cols: int, scale: float) -> np.ndarray:
        values: np.ndarray = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)
        return values

    def norm_weight() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(h, dtype=np.float32)).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(shape.vocab, h, 1.0)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal(h, q, 1 / math.sqrt(h))  # stored [in, out]: x @ W
        w[p + "self_attn.k_proj.weight"] = normal(h, kv, 1 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = normal(h, kv, 1 / math.sqrt(h))
        w[p + "self_attn.o_proj.weight"] = normal(q, h, 1 / math.sqrt(q))
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate_proj.weight"] = normal(h, f, 1 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = normal(h, f, 1 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = normal(f, h, 1 / math.sqrt(f))
    w["model.norm.weight"] = norm_weight()
    w["lm_head.weight"] = normal(h, shape.vocab, 3 / math.sqrt(h))
    return w


def rope_caches(shape: DecoderShape) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin float32 [context_length, head_dim / 2]: row p holds angle p * theta^(-2j / head_dim)."""
    half = shape.head_dim // 2
    inv_freq = 1.0 / (ROPE_THETA ** (np.arange(half, dtype=np.float64) * 2 / shape.head_dim))
    angles = np.arange(shape.context_length, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# ------------------------------------------------------------------------------------------------------------ graph
class _Graph:
    """Nodes and initializers, each node named after its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name


def _rms_norm(g: _Graph, x: str, weight: str, prefix: str) -> str:
    sq = g.op("Pow", [x, "const.two"], f"{prefix}/pow")
    mean = g.op("ReduceMean", [sq], f"{prefix}/mean", axes=[-1], keepdims=1)
    root = g.op("Sqrt", [g.op("Add", [mean, "const.eps"], f"{prefix}/add_eps")], f"{prefix}/sqrt")
    return g.op("Mul", [g.op("Div", [x, root], f"{prefix}/div"), weight], f"{prefix}/out")


def _rotary(g: _Graph, x: str, cos: str, sin: str, prefix: str) -> str:
    """Rotate-half rotary embedding of x [B, N, S, D] with cos / sin [B, 1, S, D/2]."""
    g.nodes.append(helper.make_node("Split", [x, "const.halves"], [f"{prefix}/x1", f"{prefix}/x2"],
                                    name=f"{prefix}/split", axis=-1))
    x1, x2 = f"{prefix}/x1", f"{prefix}/x2"
    a = g.op("Sub", [g.op("Mul", [x1, cos], f"{prefix}/x1cos"), g.op("Mul", [x2, sin], f"{prefix}/x2sin")],
             f"{prefix}/first")
    b = g.op("Add", [g.op("Mul", [x2, cos], f"{prefix}/x2cos"), g.op("Mul", [x1, sin], f"{prefix}/x1sin")],
             f"{prefix}/second")
    return g.op("Concat", [a, b], f"{prefix}/out", axis=-1)


def _heads(g: _Graph, x: str, n: int, d: int, prefix: str) -> str:
    """[B, S, n*d] -> [B, n, S, d]."""
    g.const(f"{prefix}/shape_value", np.array([0, 0, n, d], dtype=np.int64))
    r = g.op("Reshape", [x, f"{prefix}/shape_value"], f"{prefix}/reshape")
    return g.op("Transpose", [r], f"{prefix}/transpose", perm=[0, 2, 1, 3])


def _repeat_kv(g: _Graph, x: str, shape: DecoderShape, prefix: str) -> str:
    """[B, kv_heads, T, D] -> [B, heads, T, D]: KV head j // n_rep serves query head j."""
    if shape.kv_repeat == "gather":
        return g.op("Gather", [x, "const.kv_repeat"], prefix, axis=1)
    wide = g.op("Unsqueeze", [x, "const.ax2"], f"{prefix}/unsqueeze")  # [B, kv, 1, T, D]
    expanded = g.op("Expand", [wide, "const.kv_expand"], f"{prefix}/expand")  # [B, kv, n_rep, T, D]
    return g.op("Reshape", [expanded, "const.kv_merge"], prefix)


def build_model(shape: DecoderShape, seed: int = 0) -> onnx.ModelProto:
    """The decoder as an ONNX model (weights inline), checked by onnx.checker."""
    w = make_weights(shape, seed)
    g = _Graph()
    for name, value in w.items():
        g.const(name, value)
    cos, sin = rope_caches(shape)
    g.const("rotary.cos_cache", cos)
    g.const("rotary.sin_cache", sin)
    g.const("const.two", np.array(2.0, dtype=np.float32))
    g.const("const.eps", np.array(RMS_EPS, dtype=np.float32))
    g.const("const.scale", np.array(1.0 / math.sqrt(shape.head_dim), dtype=np.float32))
    g.const("const.mask_value", np.array(MASK_VALUE, dtype=np.float32))
    g.const("const.zero_f", np.array(0.0, dtype=np.float32))
    g.const("const.halves", np.array([shape.head_dim // 2] * 2, dtype=np.int64))
    g.const("const.i0", np.array(0, dtype=np.int64))
    g.const("const.i1", np.array(1, dtype=np.int64))
    g.const("const.ax0", np.array([0], dtype=np.int64))
    g.const("const.ax1", np.array([1], dtype=np.int64))
    g.const("const.axes12", np.array([1, 2], dtype=np.int64))

    # lengths: S (new tokens), T (past + new)
    s_len = g.op("Gather", [g.op("Shape", [INPUT_IDS], "shape/input_ids"), "const.i1"], "shape/S", axis=0)
    t_len = g.op("Gather", [g.op("Shape", [ATTENTION_MASK], "shape/attention_mask"), "const.i1"], "shape/T", axis=0)
    past_len = g.op("Sub", [t_len, s_len], "shape/past")

    # positions: given, or cumsum(attention_mask) - 1, its last S entries (padding positions clamped to 0)
    if shape.has_position_ids:
        positions = POSITION_IDS
    else:
        g.const("const.int64_max", np.array([np.iinfo(np.int64).max], dtype=np.int64))
        csum = g.op("CumSum", [ATTENTION_MASK, "const.i1"], "positions/cumsum")
        pos_all = g.op("Max", [g.op("Sub", [csum, "const.i1"], "positions/minus_one"), "const.i0"],
                       "positions/clamped")
        neg_s = g.op("Unsqueeze", [g.op("Neg", [s_len], "positions/neg_s"), "const.ax0"], "positions/start")
        positions = g.op("Slice", [pos_all, neg_s, "const.int64_max", "const.ax1"], "positions/out")
    cos_g = g.op("Unsqueeze", [g.op("Gather", ["rotary.cos_cache", positions], "rotary/cos_rows"), "const.ax1"],
                 "rotary/cos")  # [B, 1, S, D/2]
    sin_g = g.op("Unsqueeze", [g.op("Gather", ["rotary.sin_cache", positions], "rotary/sin_rows"), "const.ax1"],
                 "rotary/sin")

    # the additive mask [B, 1, S, T]: padding (attention_mask) and causality (k <= past + q)
    q_idx = g.op("Range", ["const.i0", s_len, "const.i1"], "mask/q_range")
    k_idx = g.op("Range", ["const.i0", t_len, "const.i1"], "mask/k_range")
    q_abs = g.op("Unsqueeze", [g.op("Add", [q_idx, past_len], "mask/q_abs_flat"), "const.ax1"], "mask/q_abs")  # [S,1]
    k_row = g.op("Unsqueeze", [k_idx, "const.ax0"], "mask/k_row")  # [1, T]
    causal = g.op("LessOrEqual", [k_row, q_abs], "mask/causal")  # [S, T]
    keep = g.op("Unsqueeze", [g.op("Cast", [ATTENTION_MASK], "mask/pad_bool", to=TensorProto.BOOL), "const.axes12"],
                "mask/pad")  # [B, 1, 1, T]
    visible = g.op("And", [keep, causal], "mask/visible")  # [B, 1, S, T]
    mask = g.op("Where", [visible, "const.zero_f", "const.mask_value"], "mask/additive")

    n_rep = shape.heads // shape.kv_heads
    if n_rep > 1 and shape.kv_repeat == "gather":
        g.const("const.kv_repeat", np.repeat(np.arange(shape.kv_heads, dtype=np.int64), n_rep))
    elif n_rep > 1:
        g.const("const.ax2", np.array([2], dtype=np.int64))
        g.const("const.kv_expand", np.array([1, 1, n_rep, 1, 1], dtype=np.int64))
        g.const("const.kv_merge", np.array([0, shape.heads, -1, shape.head_dim], dtype=np.int64))

    x = g.op("Gather", ["model.embed_tokens.weight", INPUT_IDS], "embed/out", axis=0)
    inputs = [helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"])]
    if shape.has_position_ids:
        inputs.append(helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]))
    outputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["batch_size", "sequence_length", shape.vocab])]
    kv_dims: list[str | int | None] = ["batch_size", shape.kv_heads, "past_sequence_length", shape.head_dim]
    present_dims: list[str | int | None] = ["batch_size", shape.kv_heads, "total_sequence_length", shape.head_dim]
    for i in range(shape.layers):
        p, n = f"model.layers.{i}.", f"layers.{i}"
        past_k, past_v = PAST_KEY % i, PAST_VALUE % i
        inputs += [helper.make_tensor_value_info(past_k, TensorProto.FLOAT, kv_dims),
                   helper.make_tensor_value_info(past_v, TensorProto.FLOAT, kv_dims)]
        outputs += [helper.make_tensor_value_info(PRESENT_KEY % i, TensorProto.FLOAT, present_dims),
                    helper.make_tensor_value_info(PRESENT_VALUE % i, TensorProto.FLOAT, present_dims)]
        h = _rms_norm(g, x, p + "input_layernorm.weight", f"{n}/input_norm")
        q = _heads(g, g.op("MatMul", [h, p + "self_attn.q_proj.weight"], f"{n}/q_proj"), shape.heads,
                   shape.head_dim, f"{n}/q")
        k = _heads(g, g.op("MatMul", [h, p + "self_attn.k_proj.weight"], f"{n}/k_proj"), shape.kv_heads,
                   shape.head_dim, f"{n}/k")
        v = _heads(g, g.op("MatMul", [h, p + "self_attn.v_proj.weight"], f"{n}/v_proj"), shape.kv_heads,
                   shape.head_dim, f"{n}/v")
        q = _rotary(g, q, cos_g, sin_g, f"{n}/q_rotary")
        k = _rotary(g, k, cos_g, sin_g, f"{n}/k_rotary")
        keys = g.op("Concat", [past_k, k], PRESENT_KEY % i, axis=2)  # the graph output itself
        values = g.op("Concat", [past_v, v], PRESENT_VALUE % i, axis=2)
        if n_rep > 1:
            keys = _repeat_kv(g, keys, shape, f"{n}/k_repeat")
            values = _repeat_kv(g, values, shape, f"{n}/v_repeat")
        kt = g.op("Transpose", [keys], f"{n}/k_transpose", perm=[0, 1, 3, 2])
        scores = g.op("Mul", [g.op("MatMul", [q, kt], f"{n}/qk"), "const.scale"], f"{n}/scaled")
        probs = g.op("Softmax", [g.op("Add", [scores, mask], f"{n}/masked")], f"{n}/probs", axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, values], f"{n}/context")], f"{n}/context_t",
                   perm=[0, 2, 1, 3])
        g.const(f"{n}/merge_shape", np.array([0, 0, shape.heads * shape.head_dim], dtype=np.int64))
        merged = g.op("Reshape", [ctx, f"{n}/merge_shape"], f"{n}/merged")
        x = g.op("Add", [x, g.op("MatMul", [merged, p + "self_attn.o_proj.weight"], f"{n}/o_proj")],
                 f"{n}/attn_residual")
        h = _rms_norm(g, x, p + "post_attention_layernorm.weight", f"{n}/post_norm")
        gate = g.op("MatMul", [h, p + "mlp.gate_proj.weight"], f"{n}/gate_proj")
        silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{n}/gate_sigmoid")], f"{n}/silu")
        up = g.op("MatMul", [h, p + "mlp.up_proj.weight"], f"{n}/up_proj")
        down = g.op("MatMul", [g.op("Mul", [silu, up], f"{n}/swiglu"), p + "mlp.down_proj.weight"], f"{n}/down_proj")
        x = g.op("Add", [x, down], f"{n}/mlp_residual")
    x = _rms_norm(g, x, "model.norm.weight", "final_norm")
    g.op("MatMul", [x, "lm_head.weight"], LOGITS)

    graph = helper.make_graph(g.nodes, "npurt_decoder", inputs, outputs, g.initializers)
    model = helper.make_model(graph, producer_name="npurt.models.decoders", producer_version="1",
                              opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    model.doc_string = (f"npurt test decoder (random weights, seed {seed}): " +
                        json.dumps(asdict(shape), sort_keys=True))
    onnx.checker.check_model(model)
    return model


# ----------------------------------------------------------------------------------------------------------- config
def genai_config(shape: DecoderShape, *, eos_token_id: int = EOS_TOKEN_ID, bos_token_id: int = BOS_TOKEN_ID,
                 pad_token_id: int = PAD_TOKEN_ID, filename: str = MODEL_FILE) -> dict[str, Any]:
    """The genai_config.json that onnxruntime-genai (0.18) reads for this decoder: type "llama", the names, the
    sizes and the special tokens; greedy search, no shared past/present buffer (the model's present is a Concat)."""
    inputs = {"input_ids": INPUT_IDS, "attention_mask": ATTENTION_MASK,
              "past_key_names": PAST_KEY, "past_value_names": PAST_VALUE}
    if shape.has_position_ids:
        inputs["position_ids"] = POSITION_IDS
    return {
        "model": {
            "type": "llama",
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
            "context_length": shape.context_length,
            "vocab_size": shape.vocab,
            "decoder": {
                "filename": filename,
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "head_size": shape.head_dim,
                "hidden_size": shape.hidden,
                "num_attention_heads": shape.heads,
                "num_key_value_heads": shape.kv_heads,
                "num_hidden_layers": shape.layers,
                "inputs": inputs,
                "outputs": {"logits": LOGITS, "present_key_names": PRESENT_KEY,
                            "present_value_names": PRESENT_VALUE},
            },
        },
        "search": {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "max_length": shape.context_length,
                   "min_length": 0, "top_k": 1, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0,
                   "past_present_share_buffer": False, "early_stopping": True, "length_penalty": 1.0,
                   "no_repeat_ngram_size": 0, "diversity_penalty": 0.0},
    }


def write_genai_config(folder: str | Path, shape: DecoderShape, *, eos_token_id: int = EOS_TOKEN_ID) -> Path:
    """Write ``genai_config.json`` into ``folder``; returns its path."""
    path = Path(folder) / GENAI_CONFIG
    path.write_text(json.dumps(genai_config(shape, eos_token_id=eos_token_id), indent=2, sort_keys=True) + "\n")
    return path


def build_decoder(folder: str | Path, shape: DecoderShape | str, seed: int = 0, *, external_data: bool = False,
                  eos_token_id: int = EOS_TOKEN_ID) -> Path:
    """Write ``model.onnx`` and ``genai_config.json`` for ``shape`` (a DecoderShape or a preset's name) into
    ``folder`` (made if missing); returns the model's path. ``external_data``: the weights go to
    ``model.onnx.data`` beside it (ONNX external data, as exports past 2 GB must), the graph stays in model.onnx."""
    shape = shape_of(shape) if isinstance(shape, str) else shape
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_model(shape, seed)
    path = folder / MODEL_FILE
    if external_data:
        (folder / EXTERNAL_DATA_FILE).unlink(missing_ok=True)  # onnx appends to a data file that is there
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=EXTERNAL_DATA_FILE, size_threshold=1024)
    else:
        path.write_bytes(model.SerializeToString())
    write_genai_config(folder, shape, eos_token_id=eos_token_id)
    return path


# --------------------------------------------------------------------------------------------------------- OpenVINO
def hf_config(shape: DecoderShape) -> dict[str, Any]:
    """A Hugging Face style config.json for the decoder (OpenVINO GenAI reads it beside the IR)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "num_hidden_layers": shape.layers,
            "vocab_size": shape.vocab, "max_position_embeddings": shape.context_length, "rms_norm_eps": RMS_EPS,
            "rope_theta": ROPE_THETA, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
            "bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "pad_token_id": PAD_TOKEN_ID}


def build_openvino_stateful(folder: str | Path, shape: DecoderShape | str, seed: int = 0, *,
                            eos_token_id: int = EOS_TOKEN_ID) -> Path:
    """Write the stateful OpenVINO IR of the same decoder (same weights) that OpenVINO GenAI's ``LLMPipeline`` takes:
    ``openvino_model.xml`` / ``.bin`` with inputs ``input_ids``, ``attention_mask``, [``position_ids``] and
    ``beam_idx`` (int32 [batch], each past gathered by it on the batch axis), the KV cache as state
    (``apply_make_stateful_transformation``), weights in f32; plus ``config.json`` and ``generation_config.json``.
    Returns the IR's path. Needs OpenVINO (imported here)."""
    import openvino as ov
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    shape = shape_of(shape) if isinstance(shape, str) else shape
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / MODEL_FILE
        onnx_path.write_bytes(build_model(shape, seed).SerializeToString())
        model = ov.Core().read_model(str(onnx_path))
    beam_idx = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name=BEAM_IDX)
    beam_idx.output(0).get_tensor().set_names({BEAM_IDX})
    axis = ops.constant(np.int64(0))
    pairs: dict[str, str] = {}
    for i in range(shape.layers):
        for past_name, present_name in ((PAST_KEY % i, PRESENT_KEY % i), (PAST_VALUE % i, PRESENT_VALUE % i)):
            port = model.input(past_name)
            param = port.get_node()
            consumers = list(port.get_target_inputs())
            gathered = ops.gather(param, beam_idx, axis)
            for consumer in consumers:
                consumer.replace_source_output(gathered.output(0))
            pairs[past_name] = present_name
    model.add_parameters([beam_idx])
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, pairs)
    path = folder / OPENVINO_MODEL
    ov.save_model(model, str(path), compress_to_fp16=False)
    (folder / "config.json").write_text(json.dumps(hf_config(shape) | {"eos_token_id": eos_token_id}, indent=2,
                                                   sort_keys=True) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": eos_token_id, "pad_token_id": PAD_TOKEN_ID,
         "do_sample": False}, indent=2, sort_keys=True) + "\n")
    return path


# -------------------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npurt.models.decoders", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the folder to write into (made if missing)")
    p.add_argument("--shape", default="gqa", choices=sorted(SHAPES), help="a preset (default gqa)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--external-data", action="store_true", help="the weights as ONNX external data (model.onnx.data)")
    p.add_argument("--openvino", action="store_true",
                   help="also the stateful OpenVINO IR for OpenVINO GenAI's LLMPipeline (needs openvino)")
    args = p.parse_args(argv)
    shape = shape_of(args.shape)
    path = build_decoder(args.out, shape, args.seed, external_data=args.external_data)
    print(f"wrote {path} and {args.out / GENAI_CONFIG}: {args.shape} {asdict(shape)}, "
          f"{shape.parameters * 4 / 1e6:.1f} MB of float32 weights, seed {args.seed}")
    if args.openvino:
        print(f"wrote {build_openvino_stateful(args.out, shape, args.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
