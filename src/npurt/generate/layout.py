"""What a decoder export is made of, read from its graph alone (a model without its weights will do): the ports
npurt's static form keeps or adds, and the cache tensors (past / present pairs) at ``max_length`` rows. The static
form (``static_form``) is built from it; the runner and the Generator only need this, and so never import onnx.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..onnx_graph import graph_inputs

if TYPE_CHECKING:
    import onnx

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
POSITION = "position"
LOGITS = "logits"
CONCAT = "concat"  # attention in standard operators, each present the Concat of its past and the new rows
GROUP_QUERY = "group_query"  # com.microsoft GroupQueryAttention (ONNX Runtime GenAI's model builder)
GQA_OP = "GroupQueryAttention"
# attention operators whose cache semantics npurt has not derived a static form for: refused by name
_NOT_UNDERSTOOD = ("MultiHeadAttention", "Attention", "PackedAttention", "PackedMultiHeadAttention",
                   "SparseAttention", "PagedAttention", "DecoderMaskedMultiHeadAttention",
                   "DecoderMaskedSelfAttention", "RotaryEmbedding", "LongformerAttention")
KV_HEADS = "kv_heads"  # the cache dims, as ``read``'s cache_dims names them
HEAD_DIM = "head_dim"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


@dataclass(frozen=True)
class CachePair:
    """One cache tensor: its past input and present output, [1, kv_heads, max_length, head_dim]."""

    past: str
    present: str
    shape: tuple[int, int, int, int]
    elem_type: int


@dataclass(frozen=True)
class Layout:
    """What the static form of an export is made of: its cache tensors at ``max_length`` rows, whether the export
    takes position ids, its vocabulary (None where the logits leave it open). Read from the graph alone (a model
    without its weights will do)."""

    max_length: int
    pairs: tuple[CachePair, ...]
    has_position_ids: bool
    vocab: int | None
    attention: str = CONCAT  # CONCAT or GROUP_QUERY: how the export's presents are made

    @property
    def kv_heads(self) -> int:
        return self.pairs[0].shape[1]

    @property
    def head_dim(self) -> int:
        return self.pairs[0].shape[3]

    def as_json(self) -> dict[str, object]:
        """The layout as JSON values (``from_json`` reads it back): a cache folder keeps it, so that a load from the
        cache reads no graph."""
        return {"max_length": self.max_length, "has_position_ids": self.has_position_ids, "vocab": self.vocab,
                "attention": self.attention,
                "pairs": [[p.past, p.present, list(p.shape), p.elem_type] for p in self.pairs]}

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> Layout:
        """``as_json``'s layout. KeyError, TypeError or ValueError where ``value`` is not one."""
        pairs = tuple(CachePair(str(past), str(present), (int(a), int(b), int(c), int(d)), int(elem))
                      for past, present, (a, b, c, d), elem in value["pairs"])
        vocab = value["vocab"]
        return Layout(int(value["max_length"]), pairs, bool(value["has_position_ids"]),
                      None if vocab is None else int(vocab), str(value["attention"]))

    @property
    def cache_dims(self) -> dict[str, tuple[int, str]]:
        """The cache dims as ``read`` read them, for reading the export again (it may only name them)."""
        return {KV_HEADS: (self.kv_heads, "the layout read at load"), HEAD_DIM: (self.head_dim, "the same")}


def read(model: onnx.ModelProto, max_length: int, weight_dims: Mapping[str, tuple[int, ...]] | None = None,
         cache_dims: Mapping[str, tuple[int, str]] | None = None) -> Layout:
    """The export's layout (see Layout), checked; raises ValueError naming what does not fit it (no past / present,
    names that do not pair, a missing input, a max_length below 1, an attention operator not understood, rotary
    tables shorter than max_length, cache dims that nothing fixes). ``weight_dims``: the dims of initializers left
    out of a weightless model. ``cache_dims``: ``KV_HEADS`` / ``HEAD_DIM`` -> (value, where it was read), for the
    cache dims an export names instead of fixing (the model builder's ``kv_cache_dim``: its genai_config.json gives
    ``head_size``); where the graph fixes a dim, the graph's is taken."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, not {max_length}")
    inputs = {v.name: v for v in graph_inputs(model.graph)}
    outputs = {v.name for v in model.graph.output}
    for name in (INPUT_IDS, ATTENTION_MASK):
        if name not in inputs:
            raise ValueError(f"not a decoder in ONNX Runtime GenAI's layout: it has no input {name!r} "
                             f"(inputs: {sorted(inputs)})")
    if LOGITS not in outputs:
        raise ValueError(f"not a decoder in ONNX Runtime GenAI's layout: it has no output 'logits' "
                         f"(outputs: {sorted(outputs)})")
    known = dict(cache_dims or {})
    # GroupQueryAttention fixes the KV heads in an attribute where the graph names that dim
    gqa = next((n for n in model.graph.node if n.op_type == GQA_OP and n.domain == "com.microsoft"), None)
    heads_attr = next((a.i for a in gqa.attribute if a.name == "kv_num_heads"), 0) if gqa is not None else 0
    if heads_attr > 0:
        known[KV_HEADS] = (heads_attr, f"{GQA_OP}'s kv_num_heads")  # (the graph wins over a config)
    pairs = []
    for name, value in inputs.items():
        match = _PAST.match(name)
        if match is None:
            continue
        present = f"present.{match.group(1)}.{match.group(2)}"
        if present not in outputs:
            raise ValueError(f"past input {name!r} has no present output {present!r} to pair with")
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 4:
            raise ValueError(f"past input {name!r} is not [batch, kv_heads, past, head_dim]: its dims are "
                             f"{_dims_text(dims)}")
        kv_heads = _cache_dim(name, dims, 1, KV_HEADS, known)
        head_dim = _cache_dim(name, dims, 3, HEAD_DIM, known)
        pairs.append(CachePair(name, present, (1, kv_heads, max_length, head_dim), value.type.tensor_type.elem_type))
    if not pairs:
        raise ValueError("not a decoder with a KV cache: no past_key_values.{i}.key / .value inputs")
    orphans = sorted(o for o in outputs if o.startswith("present.") and o not in {p.present for p in pairs})
    if orphans:
        raise ValueError(f"present output {orphans[0]!r} has no past_key_values input to pair with")
    feedable = {INPUT_IDS, ATTENTION_MASK, POSITION_IDS} | {p.past for p in pairs}
    extra = sorted(set(inputs) - feedable)
    if extra:
        raise ValueError(f"decoder input {extra[0]!r} is not one npurt can feed (known: input_ids, attention_mask, "
                         "position_ids, past_key_values.{i}.key/value)")
    ordered = tuple(sorted(pairs, key=lambda p: _order(p.past)))
    attention = _attention(model.graph, ordered, max_length, weight_dims or {})
    return Layout(max_length, ordered, POSITION_IDS in inputs, _vocab(model.graph), attention)


def _attention(graph: onnx.GraphProto, pairs: tuple[CachePair, ...], max_length: int,
               weight_dims: Mapping[str, tuple[int, ...]]) -> str:
    """CONCAT, or GROUP_QUERY where every present is a GroupQueryAttention node's own output over its past (its
    shared-buffer mode then keeps the cache in place); ValueError for anything else npurt has not derived."""
    ops = {n.op_type for n in graph.node if n.domain in ("com.microsoft", "")}
    odd = sorted(ops & set(_NOT_UNDERSTOOD))
    if odd:
        raise ValueError(f"attention by {odd[0]} is not one npurt derives a static form for (it does: standard "
                         "operators with a Concat cache, com.microsoft GroupQueryAttention)")
    nodes = [n for n in graph.node if n.op_type == GQA_OP and n.domain == "com.microsoft"]
    if not nodes:
        return CONCAT
    made_by = {out: (node, i) for node in nodes for i, out in enumerate(node.output)}
    constants = {t.name: tuple(t.dims) for t in graph.initializer} | dict(weight_dims)
    for pair in pairs:
        node, index = made_by.get(pair.present, (None, -1))
        if node is None or index not in (1, 2) or len(node.input) <= index + 2 or node.input[index + 2] != pair.past:
            raise ValueError(f"present {pair.present!r} is not the output of a GroupQueryAttention node over "
                             f"{pair.past!r} (a model that mixes attention forms is not one npurt derives)")
        attrs = {a.name: a for a in node.attribute}
        window = attrs["local_window_size"].i if "local_window_size" in attrs else -1
        if window != -1:
            raise ValueError(f"GroupQueryAttention {node.name!r} attends over a sliding window (local_window_size "
                             f"{window}), which npurt's static form does not derive")
        if "do_rotary" in attrs and attrs["do_rotary"].i and len(node.input) > 7:
            rows = constants.get(node.input[7], (0,))[0] if node.input[7] in constants else None
            if rows is None:
                raise ValueError(f"GroupQueryAttention {node.name!r}: its rotary table {node.input[7]!r} is not a "
                                 "constant of the model")
            if rows < max_length:
                raise ValueError(f"GroupQueryAttention {node.name!r}: its rotary tables have {rows} rows, fewer than "
                                 f"max_length {max_length}: positions past {rows - 1} have no rotation (give a "
                                 f"max_length of at most {rows})")
    return GROUP_QUERY


def _dims_text(dims: Sequence[onnx.TensorShapeProto.Dimension]) -> str:
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) + "]"


def _cache_dim(name: str, dims: Sequence[onnx.TensorShapeProto.Dimension], index: int, what: str,
               known: Mapping[str, tuple[int, str]]) -> int:
    """Dim ``index`` of past input ``name``: the graph's where it fixes it, else ``known``'s; ValueError naming the
    dims found where neither gives it."""
    dim = dims[index]
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    if what in known:
        return known[what][0]
    raise ValueError(f"past input {name!r} has dims {_dims_text(dims)}: its {what} (dim {index}, "
                     f"{dim.dim_param or 'unnamed'!r}) is not fixed, and nothing beside the graph gives it "
                     "(genai_config.json's model.decoder head_size / num_key_value_heads, config.json's head_dim / "
                     "num_key_value_heads)")


def _order(name: str) -> tuple[int, str]:
    match = _PAST.match(name)
    assert match is not None
    return int(match.group(1)), match.group(2)


def _vocab(graph: onnx.GraphProto) -> int | None:
    logits = next(v for v in graph.output if v.name == LOGITS)
    dims = logits.type.tensor_type.shape.dim
    return int(dims[-1].dim_value) if dims and dims[-1].HasField("dim_value") else None
