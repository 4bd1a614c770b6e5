"""Random-weight BERT-shaped embedding models in the two folder forms people download, for fast tests of
``npurt.Embedder`` (the real all-MiniLM-L6-v2 folders of tools/real_models are the slow, real ones).

- ``"sentence-transformers"``: as sentence-transformers' ONNX backend saves a model: ``onnx/model.onnx`` (inputs
  ``input_ids``, ``attention_mask``, ``token_type_ids``; output ``last_hidden_state`` [batch, sequence, hidden]),
  ``modules.json`` (Transformer, Pooling, and Normalize where asked), ``1_Pooling/config.json``,
  ``sentence_bert_config.json``, ``config_sentence_transformers.json`` (its prompts);
- ``"optimum"``: as optimum's feature-extraction export of a sentence-transformers model writes it: ``model.onnx``
  with inputs ``input_ids`` and ``attention_mask`` only and outputs ``token_embeddings`` and ``sentence_embedding``
  (mean pooling over the mask and L2 normalisation inside the graph).

Both carry ``config.json`` (``max_position_embeddings``), ``tokenizer_config.json`` (``model_max_length``) and a
BERT-style WordPiece ``tokenizer.json`` trained here (lower-casing normaliser, ``[CLS] $A [SEP]``, pad id 0) which,
as the real folders' does, pads and truncates at 128 itself: a reader must override that.

The graph is BERT's post-LayerNorm encoder written with plain ONNX ops (opset 18): word + position + token-type
embeddings, LayerNormalization, per layer a masked multi-head self-attention (the additive mask
``(1 - mask) * float32.min`` as transformers builds it) and an Erf-GELU feed-forward. Weights come from a seed.

    write_bert(folder, form="sentence-transformers", pooling="mean", normalize=True)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .tokenizer_files import corpus

FORMS = ("sentence-transformers", "optimum")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4
OPSET = 18
TOKENIZER_PADS_AT = 128  # what the real folders' tokenizer.json pads and truncates to


@dataclass(frozen=True)
class BertShape:
    vocab_size: int = 1000
    hidden: int = 32
    heads: int = 2
    layers: int = 2
    intermediate: int = 64
    max_position_embeddings: int = 512
    type_vocab_size: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def weight(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        self._count += 1
        out = output or f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type}_{self._count}", **attrs))
        return out


def _bert_graph(shape: BertShape, form: str, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def normal(*dims: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    g = _Graph()
    h, heads, hd = shape.hidden, shape.heads, shape.head_dim
    one = g.weight("one_f", np.array(1.0, np.float32))

    # embeddings
    words = g.op("Gather", [g.weight("word_embeddings", normal(shape.vocab_size, h, scale=0.5)), "input_ids"])
    # the position table sliced to the sequence (as transformers' exports do: a Slice whose end is the input's
    # length, which shape inference follows, so a static-shape compile knows every output's shape)
    seq = g.op("Slice", [g.op("Shape", ["input_ids"]), g.weight("one_1d", np.array([1], np.int64)),
                         g.weight("two_1d", np.array([2], np.int64))])
    table = g.weight("position_embeddings", normal(shape.max_position_embeddings, h, scale=0.5))
    pos = g.op("Slice", [table, g.weight("zero_1d", np.array([0], np.int64)), seq,
                         g.weight("axes_0", np.array([0], np.int64))])
    types_table = normal(shape.type_vocab_size, h, scale=0.5)
    if form == "sentence-transformers":
        types = g.op("Gather", [g.weight("token_type_embeddings", types_table), "token_type_ids"])
    else:  # no token_type_ids input: type 0 everywhere, as optimum's export of MiniLM folds it
        types = g.weight("token_type_embeddings_0", types_table[0])
    x = g.op("Add", [g.op("Add", [words, pos]), types])

    def layer_norm(value: str, prefix: str) -> str:
        gamma = g.weight(f"{prefix}.gamma", (1.0 + normal(h, scale=0.05)).astype(np.float32))
        beta = g.weight(f"{prefix}.beta", normal(h, scale=0.05))
        return g.op("LayerNormalization", [value, gamma, beta], axis=-1, epsilon=1e-12)

    def linear(value: str, prefix: str, n_in: int, n_out: int) -> str:
        w = g.weight(f"{prefix}.weight", normal(n_in, n_out, scale=1.0 / math.sqrt(n_in)))
        return g.op("Add", [g.op("MatMul", [value, w]), g.weight(f"{prefix}.bias", normal(n_out, scale=0.02))])

    x = layer_norm(x, "embeddings.LayerNorm")
    # the additive mask [B, 1, 1, S]: 0 where attended, float32's minimum where padded (transformers' form)
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    inverted = g.op("Sub", [one, mask_f])
    additive = g.op("Mul", [inverted, g.weight("mask_min", np.array(np.finfo(np.float32).min, np.float32))])
    additive = g.op("Unsqueeze", [additive, g.weight("axes_1_2", np.array([1, 2], np.int64))])
    split_heads = g.weight("split_heads", np.array([0, 0, heads, hd], np.int64))
    merge_heads = g.weight("merge_heads", np.array([0, 0, h], np.int64))
    scale = g.weight("attention_scale", np.array(1.0 / math.sqrt(hd), np.float32))
    sqrt2 = g.weight("sqrt2", np.array(math.sqrt(2.0), np.float32))
    half = g.weight("half", np.array(0.5, np.float32))
    for layer in range(shape.layers):
        p = f"encoder.layer.{layer}"
        q, k, v = (g.op("Reshape", [linear(x, f"{p}.attention.{n}", h, h), split_heads]) for n in "qkv")
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), additive])
        context = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads])
        x = layer_norm(g.op("Add", [x, linear(context, f"{p}.attention.output", h, h)]), f"{p}.attention.LayerNorm")
        up = linear(x, f"{p}.intermediate", h, shape.intermediate)
        gelu = g.op("Mul", [g.op("Mul", [up, half]), g.op("Add", [g.op("Erf", [g.op("Div", [up, sqrt2])]), one])])
        x = layer_norm(g.op("Add", [x, linear(gelu, f"{p}.output", shape.intermediate, h)]), f"{p}.output.LayerNorm")

    names = ("input_ids", "attention_mask", "token_type_ids")[:3 if form == "sentence-transformers" else 2]
    ids_info = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch_size", "sequence_length"]) for n in names]
    if form == "sentence-transformers":
        g.op("Identity", [x], "last_hidden_state")
        outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                                 ["batch_size", "sequence_length", h])]
    else:
        g.op("Identity", [x], "token_embeddings")
        axis1 = g.weight("axes_1", np.array([1], np.int64))
        mask3 = g.op("Unsqueeze", [mask_f, g.weight("axes_2", np.array([2], np.int64))])
        summed = g.op("ReduceSum", [g.op("Mul", [x, mask3]), axis1], keepdims=0)
        count = g.op("Clip", [g.op("ReduceSum", [mask3, axis1], keepdims=0),
                              g.weight("min_count", np.array(1e-9, np.float32))])
        mean = g.op("Div", [summed, count])
        norm = g.op("Clip", [g.op("ReduceL2", [mean, axis1], keepdims=1),
                             g.weight("min_norm", np.array(1e-12, np.float32))])
        g.op("Div", [mean, norm], "sentence_embedding")
        outputs = [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT,
                                                 ["batch_size", "sequence_length", h]),
                   helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch_size", h])]
    graph = helper.make_graph(g.nodes, "bert", ids_info, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def write_wordpiece_tokenizer(folder: Path, vocab_size: int, model_max_length: int | None, seed: int = 0) -> None:
    """A BERT-style WordPiece ``tokenizer.json`` of exactly ``vocab_size`` ids (specials 0..4) that pads and
    truncates at 128 itself (as the real folders' does), and ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False)
    tok.train_from_iterator(corpus(lines=3000, words=2000, seed=seed), trainer)
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        raise RuntimeError(f"the WordPiece tokenizer came out with {size} ids, not {vocab_size}")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.enable_truncation(TOKENIZER_PADS_AT)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=TOKENIZER_PADS_AT)
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "clean_up_tokenization_spaces": False,
        "max_length": TOKENIZER_PADS_AT}
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_bert(folder: str | Path, form: str = "sentence-transformers", *, pooling: str | list[str] = "mean",
               normalize: bool = True, include_prompt: bool = True, max_seq_length: int | None = None,
               model_max_length: int | None = 512, prompts: dict[str, str] | None = None,
               default_prompt_name: str | None = None, shape: BertShape | None = None, seed: int = 0) -> Path:
    """A random-weight BERT embedding folder in ``form`` (``FORMS``); returns it. ``pooling`` (a mode of
    sentence-transformers' Pooling, or a list to concatenate), ``normalize`` (a Normalize module), ``include_prompt``,
    ``max_seq_length`` (written to sentence_bert_config.json where given), ``model_max_length`` (tokenizer_config
    .json's, None: left out), ``prompts`` / ``default_prompt_name`` (config_sentence_transformers.json) apply to the
    sentence-transformers form; the optimum form has mean pooling and normalisation in its graph."""
    if form not in FORMS:
        raise ValueError(f"form: one of {', '.join(FORMS)}, got {form!r}")
    shape = shape or BertShape()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = _bert_graph(shape, form, seed)
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": shape.hidden,
              "num_attention_heads": shape.heads, "num_hidden_layers": shape.layers,
              "intermediate_size": shape.intermediate, "max_position_embeddings": shape.max_position_embeddings,
              "type_vocab_size": shape.type_vocab_size, "vocab_size": shape.vocab_size, "layer_norm_eps": 1e-12,
              "hidden_act": "gelu", "pad_token_id": 0, "position_embedding_type": "absolute"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_wordpiece_tokenizer(folder, shape.vocab_size, model_max_length, seed)
    if form == "optimum":
        onnx.save(model, folder / "model.onnx")
        return folder
    (folder / "onnx").mkdir(exist_ok=True)
    onnx.save(model, folder / "onnx" / "model.onnx")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling_config = {"embedding_dimension": shape.hidden, "pooling_mode": pooling, "include_prompt": include_prompt}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")
    st_config: dict[str, object] = {"do_lower_case": False}
    if max_seq_length is not None:
        st_config["max_seq_length"] = max_seq_length
    (folder / "sentence_bert_config.json").write_text(json.dumps(st_config, indent=2) + "\n")
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"model_type": "SentenceTransformer", "prompts": prompts or {}, "default_prompt_name": default_prompt_name,
         "similarity_fn_name": "cosine"}, indent=2) + "\n")
    return folder
