"""Decoders in the forms people download, for the OpenVINO tests (issue 43), until `npurt.models` builds them:

- `builder_form`: ONNX Runtime GenAI's model builder form: com.microsoft ``GroupQueryAttention`` with the rotary
  embedding fused in (``do_rotary=1``, cos / sin caches [context, head_dim / 2], so no ``position_ids`` input),
  ``seqlens_k`` = ReduceSum(attention_mask) - 1 (int32) and ``total_sequence_length`` = attention_mask.shape[1]
  (int32) computed from the mask, ``SimplifiedLayerNormalization`` (ONNX domain) and
  ``SkipSimplifiedLayerNormalization`` (com.microsoft, output 3: the residual sum); fp32 or fp16 throughout (fp16:
  weights, cache and logits, as the builder's ``-p fp16``).
- `int4`: ONNX Runtime's own ``MatMulNBitsQuantizer`` over a model (block size, zero points, accuracy level).
- `greedy_plain`: plain ONNX Runtime's greedy loop over any of them, the cache growing, in the export's own dtype
  (`npurt.models.decoder_reference`'s loop feeds float32 pasts).

Weights are `npurt.models.decoders.make_weights` (same seed, same numbers as the standard decoders).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npurt.models.decoder_reference import Greedy, top2_gap
from npurt.models.decoders import RMS_EPS, DecoderShape, make_weights, rope_caches

MODEL_FILE = "model.onnx"
# head_dim a multiple of 16: ONNX Runtime's CPU GroupQueryAttention with do_rotary needs it
BUILDER_SHAPE = DecoderShape(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=1000,
                             context_length=256)


def builder_form(shape: DecoderShape = BUILDER_SHAPE, seed: int = 0, *, fp16: bool = False) -> onnx.ModelProto:
    """The decoder of ``shape`` / ``seed`` in the model builder's form (see the module)."""
    dtype, elem = (np.float16, TensorProto.FLOAT16) if fp16 else (np.float32, TensorProto.FLOAT)
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(v.astype(dtype), k) for k, v in make_weights(shape, seed).items()]
    cos, sin = rope_caches(shape)
    inits += [numpy_helper.from_array(cos.astype(dtype), "cos_cache"),
              numpy_helper.from_array(sin.astype(dtype), "sin_cache"),
              numpy_helper.from_array(np.array([1], np.int64), "one"),
              numpy_helper.from_array(np.array(1, np.int64), "one_scalar")]

    def node(op: str, inputs: list[str], outputs: list[str] | str, domain: str = "", **attrs: object) -> str:
        outs = [outputs] if isinstance(outputs, str) else outputs
        nodes.append(helper.make_node(op, inputs, outs, name=outs[0] + "/node", domain=domain, **attrs))
        return outs[0]

    # the builder's mask subgraph: seqlens_k [B] int32 and total_sequence_length (scalar int32)
    summed = node("ReduceSum", ["attention_mask", "one"], "mask/sum", keepdims=0)
    node("Cast", [node("Sub", [summed, "one"], "mask/minus_one")], "seqlens_k", to=TensorProto.INT32)
    total = node("Gather", [node("Shape", ["attention_mask"], "mask/shape"), "one_scalar"], "mask/total", axis=0)
    node("Cast", [total], "total_sequence_length", to=TensorProto.INT32)

    x = node("Gather", ["model.embed_tokens.weight", "input_ids"], "embed", axis=0)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", elem, ["batch_size", "sequence_length", shape.vocab])]
    past = ["batch_size", shape.kv_heads, "past_sequence_length", shape.head_dim]
    present = ["batch_size", shape.kv_heads, "total_sequence_length", shape.head_dim]
    residual = x
    pending: str | None = None  # the last block's output, added to the residual by the next norm
    for i in range(shape.layers):
        p, n = f"model.layers.{i}.", f"layers.{i}"
        inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", elem, past) for kv in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"present.{i}.{kv}", elem, present) for kv in ("key", "value")]
        if pending is None:
            h = node("SimplifiedLayerNormalization", [residual, p + "input_layernorm.weight"], f"{n}/input_norm",
                     axis=-1, epsilon=RMS_EPS)
        else:
            h, residual = _skip_norm(node, pending, residual, p + "input_layernorm.weight", f"{n}/input_norm")
        q, k, v = (node("MatMul", [h, p + f"self_attn.{m}_proj.weight"], f"{n}/{m}_proj") for m in "qkv")
        attn = node("GroupQueryAttention",
                    [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                     "total_sequence_length", "cos_cache", "sin_cache"],
                    [f"{n}/attn", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                    num_heads=shape.heads, kv_num_heads=shape.kv_heads, do_rotary=1, rotary_interleaved=0,
                    scale=1.0 / math.sqrt(shape.head_dim))
        o = node("MatMul", [attn, p + "self_attn.o_proj.weight"], f"{n}/o_proj")
        h, residual = _skip_norm(node, o, residual, p + "post_attention_layernorm.weight", f"{n}/post_norm")
        gate = node("MatMul", [h, p + "mlp.gate_proj.weight"], f"{n}/gate_proj")
        silu = node("Mul", [gate, node("Sigmoid", [gate], f"{n}/sigmoid")], f"{n}/silu")
        up = node("MatMul", [h, p + "mlp.up_proj.weight"], f"{n}/up_proj")
        pending = node("MatMul", [node("Mul", [silu, up], f"{n}/swiglu"), p + "mlp.down_proj.weight"],
                       f"{n}/down_proj")
    assert pending is not None
    h, _ = _skip_norm(node, pending, residual, "model.norm.weight", "final_norm")
    node("MatMul", [h, "lm_head.weight"], "logits")
    graph = helper.make_graph(nodes, "builder_form", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _skip_norm(node: Callable[..., str], x: str, skip: str, weight: str, name: str) -> tuple[str, str]:
    """SkipSimplifiedLayerNormalization: (norm(x + skip), x + skip)."""
    outs = [f"{name}/out", f"{name}/mean", f"{name}/inv_std", f"{name}/sum"]
    node("SkipSimplifiedLayerNormalization", [x, skip, weight], outs, domain="com.microsoft", epsilon=RMS_EPS)
    return outs[0], outs[3]


def int4(model: onnx.ModelProto, *, block_size: int = 32, zero_points: bool = False,
         accuracy_level: int = 0) -> onnx.ModelProto:
    """``model`` with its MatMul weights quantized to int4 MatMulNBits by ONNX Runtime's own quantizer (needs
    onnx_ir); ``zero_points``: asymmetric (a zero point per block)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, block_size=block_size, is_symmetric=not zero_points,
                                     accuracy_level=accuracy_level)
    quantizer.process()
    out: onnx.ModelProto = quantizer.model.model
    assert any(n.op_type == "MatMulNBits" for n in out.graph.node)
    return out


def save(model: onnx.ModelProto, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    path.write_bytes(model.SerializeToString())
    return path


def greedy_plain(model_path: Path, prompt_ids: Sequence[int], max_new_tokens: int) -> Greedy:
    """Plain ONNX Runtime (CPU provider) greedy over the export: the prompt in one run, then a token a run, each
    present fed back as the next past (in the export's own dtype); logits kept as float32."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), dtypes[i.type]) for i in session.get_inputs()
            if i.name.startswith("past_key_values.")}
    names = [o.name for o in session.get_outputs()]
    has_positions = any(i.name == "position_ids" for i in session.get_inputs())
    out = Greedy(start=time.perf_counter())
    ids = np.asarray([prompt_ids], np.int64)
    total = ids.shape[1]
    for _ in range(max_new_tokens):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past}
        if has_positions:
            feeds["position_ids"] = np.arange(total - ids.shape[1], total, dtype=np.int64)[None, :]
        results = dict(zip(names, session.run(names, feeds)))
        logits = np.asarray(results["logits"][0, -1], np.float32)
        out.tokens.append(int(np.argmax(logits)))
        out.logits.append(logits)
        out.gaps.append(top2_gap(logits))
        out.times.append(time.perf_counter())
        past = {name: results[name.replace("past_key_values.", "present.")] for name in past}
        ids = np.asarray([[out.tokens[-1]]], np.int64)
        total += 1
    return out
