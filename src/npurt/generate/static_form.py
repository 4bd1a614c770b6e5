"""The static-shape form of a decoder that an NPU compiles, derived from the ordinary export.

An export (ONNX Runtime GenAI's model builder, optimum) takes ``input_ids`` [B, S], ``attention_mask`` [B, T],
``position_ids`` [B, S] (optional) and ``past_key_values.{i}.key/value`` [B, kv_heads, T - S, head_dim], and returns
``logits`` [B, S, vocab] and ``present.{i}.key/value`` [B, kv_heads, T, head_dim]: a cache that grows every step, a
shape an NPU cannot compile. The derived form keeps the export's graph untouched inside and wraps it:

- the cache is ``past_key_values.{i}.*`` of ``max_length`` rows, always (rows past the position are unused);
- one input ``position`` [1] (int64) replaces the mask and the position ids: the graph computes
  ``attention_mask`` = [row < position for each cache row] + [1] * S (the export sees a past of max_length rows of
  which only the first ``position`` count, then the S new tokens, causally among themselves) and
  ``position_ids`` = position + [0 .. S-1];
- each ``present.{i}.*`` is the cache with the S new rows written at rows position .. position + S - 1, by the
  form of the export's attention:
  - standard operators (a present is the Concat of its past and the new rows): the export's last S present rows,
    scattered there (ScatterElements on axis 2);
  - com.microsoft GroupQueryAttention (ONNX Runtime GenAI's model builder): the operator's own shared-buffer mode.
    The mask fed to the export is ones over position + S rows, so its own subgraph gives ``seqlens_k`` =
    position + S - 1 and ``total_sequence_length`` = position + S; with past and present bound to one buffer of
    max_length rows the operator writes the new rows at seqlens_k + 1 - S = position in place, takes the rotary
    positions from there, and attends over rows 0 .. position + s only. The present is the node's own output.
  Bound to the same buffer as its past, a step writes its rows in place and moves nothing else.
- ``logits`` is the last of the S rows only, [1, 1, vocab]: a caller needs no more, and [1, S, vocab] per prompt
  length is ~0.6 MB per prompt token at a 150k vocabulary. Where the export's logits come from an LM head that
  computes each row from that row of its input alone (``row_wise_head``: a MatMul over a 2-D weight, a
  MatMulNBits), that node reads its input's last row (a Slice before it): the other S - 1 rows of the LM head are
  not computed (SmolLM2-135M: 37 of a 38-id prompt's rows, ~1 GFLOP, ~20 ms of its first token, and the 7.5 MB
  they were written to). Otherwise the logits are sliced after the export.

So a step moves the ids and a position in and the logits out. S is left open (one graph, prefill chunks and
one-token steps) or pinned by the caller per compiled shape. The caller keeps position + S <= max_length and keeps the
last row a real token (a padded run's logits are not the prompt's). Masked cache rows add exact zeros to the export's
softmax (GroupQueryAttention never reads them), so the logits are the export's own up to the order of summation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import onnx_proto
from ..onnx_build import GraphBuilder
from ..onnx_proto import TensorProto, make_tensor_value_info, rename_uses, set_shape
from .layout import ATTENTION_MASK, GROUP_QUERY, INPUT_IDS, LOGITS, POSITION, POSITION_IDS, Layout, read

if TYPE_CHECKING:
    import onnx

FULL_SUFFIX = "__npurt_full"
LAST_SUFFIX = "__npurt_last"  # the LM head's input, its last row (row_wise_head)
BATCH_DIM = "batch"  # the batch form's open batch dim, on every port that has one
PREFIX = "__npurt_decoder"


@dataclass(frozen=True)
class StaticForm:
    model: onnx.ModelProto
    layout: Layout


def derive(model: onnx.ModelProto, max_length: int, sequence: int | None = None,
           weight_dims: Mapping[str, tuple[int, ...]] | None = None, batch: int | None = 1, *,
           sliced: bool = False, cache_dims: Mapping[str, tuple[int, str]] | None = None) -> StaticForm:
    """The static form of ``model`` (see the module) with a cache of ``max_length`` rows; ``sequence`` pins S
    (None leaves it open). ``model`` is not changed; ``weight_dims``, ``cache_dims``: see ``layout.read``.
    ``batch``: 1 (the form above), or B rows of independent sequences (None: the batch dim open, named BATCH_DIM),
    see ``derive_batch``.
    ``sliced`` (one sequence over a Concat cache, for devices that take open shapes): the export reads the cache's
    first ``position`` rows only, so its attention covers the rows written, not max_length (a shape that changes
    every step: never for an NPU)."""
    if batch != 1:
        return derive_batch(model, max_length, sequence, weight_dims, batch, cache_dims)
    shape = read(model, max_length, weight_dims, cache_dims)
    has_position_ids = shape.has_position_ids
    form, graph, b = _with_position(model, shape, 1, sequence)

    s = b.node("Gather", [b.node("Shape", [INPUT_IDS]), b.const([1])])  # [1]: S
    steps = b.node("Range", [b.const(np.array(0, np.int64)), b.node("Squeeze", [s]), b.const(np.array(1, np.int64))])
    rows = b.node("Add", [POSITION, steps])  # [S]: the rows (positions) of the new tokens
    if has_position_ids:
        b.node("Unsqueeze", [rows, b.const([0])], POSITION_IDS)
    if shape.attention == GROUP_QUERY:
        zero, one = b.const(np.array(0, np.int64)), b.const(np.array(1, np.int64))
        # ones over position + S rows (a Range compared, as below); the operator itself does the rest (module)
        total = b.node("Add", [POSITION, s])
        every_row = b.node("Range", [zero, b.node("Squeeze", [total]), one])
        visible = b.node("GreaterOrEqual", [every_row, zero])
        b.node("Unsqueeze", [b.node("Cast", [visible], to=TensorProto.INT64), b.const([0])], ATTENTION_MASK)
        head: list[onnx.NodeProto] = list(b.nodes)
        tail: list[onnx.NodeProto] = []
    else:
        head, tail = _concat_cache(graph, b, shape, s, rows, sliced)
    _around_the_export(graph, b, shape, head, tail, 1, weight_dims)
    return StaticForm(form, shape)


def derive_batch(model: onnx.ModelProto, max_length: int, sequence: int | None = None,
                 weight_dims: Mapping[str, tuple[int, ...]] | None = None, batch: int | None = None,
                 cache_dims: Mapping[str, tuple[int, str]] | None = None) -> StaticForm:
    """The static form of B independent sequences, one per row of the batch (None: B open): ``input_ids`` [B, S],
    ``position`` [B] (each row's own), the cache [B, kv_heads, max_length, head_dim] (row b a sequence's cache),
    ``logits`` [B, 1, vocab] (each row's last). Per row as the module says for one:

    - Concat caches: the mask [B, max_length + S], row b visible where its cache row < position[b] or new;
      ``position_ids`` [B, S] = position[b] + [0 .. S-1]; each present scattered with per-row indices;
    - GroupQueryAttention: the mask [B, max(position) + S], row b ones over its first position[b] + S (zeros after:
      padding), so the export's own subgraph gives ``seqlens_k`` [B] = position + S - 1 per row and the operator
      writes and reads each row of the shared buffer at its own place.

    A row with nothing to run (idle) runs a pad token at its own position: it writes the row of its cache there,
    which a later run writes again before any query reads it."""
    shape = read(model, max_length, weight_dims, cache_dims)
    pairs, has_position_ids = shape.pairs, shape.has_position_ids
    form, graph, b = _with_position(model, shape, batch, sequence)

    zero, one = b.const(np.array(0, np.int64)), b.const(np.array(1, np.int64))
    s = b.node("Gather", [b.node("Shape", [INPUT_IDS]), b.const([1])])  # [1]: S
    steps = b.node("Range", [zero, b.node("Squeeze", [s]), one])
    column = b.node("Unsqueeze", [POSITION, b.const([1])])  # [B, 1]
    rows = b.node("Add", [column, steps])  # [B, S]: each row's new tokens' rows (positions)
    if has_position_ids:
        b.node("Identity", [rows], POSITION_IDS)
    if shape.attention == GROUP_QUERY:
        ends = b.node("Add", [column, s])  # [B, 1]: position + S
        total = b.node("Add", [b.node("ReduceMax", [POSITION], keepdims=0), b.node("Squeeze", [s])])
        every_row = b.node("Range", [zero, total, one])  # [max(position) + S]
        b.node("Cast", [b.node("Less", [every_row, ends])], ATTENTION_MASK, to=TensorProto.INT64)
        head: list[onnx.NodeProto] = list(b.nodes)
        tail: list[onnx.NodeProto] = []
    else:
        every_row = b.node("Range", [zero, b.node("Add", [b.const(np.array(max_length, np.int64)),
                                                          b.node("Squeeze", [s])]), one])
        visible = b.node("Or", [b.node("Less", [every_row, column]),
                                b.node("GreaterOrEqual", [every_row, b.const(np.array(max_length, np.int64))])])
        b.node("Cast", [visible], ATTENTION_MASK, to=TensorProto.INT64)  # [B, max_length + S]
        head = list(b.nodes)
        b.nodes.clear()
        ends_all = b.const([np.iinfo(np.int64).max])
        start, axis = b.const([max_length]), b.const([2])
        index = b.node("Unsqueeze", [rows, b.const([1, 3])])  # [B, 1, S, 1]
        for pair in pairs:
            full = pair.present + FULL_SUFFIX
            rename_uses(graph, pair.present, full, outputs_too=True)
            new = b.node("Slice", [full, start, ends_all, axis])
            where = b.node("Expand", [index, b.node("Shape", [new])])
            b.node("ScatterElements", [pair.past, where, new], pair.present, axis=2)
        tail = list(b.nodes)
    _around_the_export(graph, b, shape, head, tail, batch, weight_dims)
    if batch is None:  # one name for the batch dim on every port, so that a stream's state takes the ids' batch
        for value in [*graph.input, *graph.output]:
            if value.name in (INPUT_IDS, LOGITS) or value.name.startswith(("past_key_values.", "present.")):
                value.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    return StaticForm(form, shape)


def _around_the_export(graph: onnx.GraphProto, b: GraphBuilder, shape: Layout, head: list[onnx.NodeProto],
                       tail: list[onnx.NodeProto], batch: int | None,
                       weight_dims: Mapping[str, tuple[int, ...]] | None) -> None:
    """The graph's nodes as ``head``, the export's own (its LM head over its input's last row where it is row-wise:
    ``row_wise_head``), ``tail`` and else the slice of the logits' last row; the outputs' shapes: each present the
    cache of max_length rows, the logits [batch, 1, vocab]."""
    b.nodes.clear()
    lm_head = row_wise_head(graph, weight_dims)
    if lm_head is not None:  # the head over its input's last row, in place in the export's order
        rows = lm_head.input[0]
        b.node("Slice", [rows, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1])], rows + LAST_SUFFIX)
        lm_head.input[0] = rows + LAST_SUFFIX
        at = list(graph.node).index(lm_head)
        export = [*graph.node[:at], *b.nodes, *graph.node[at:]]
        b.nodes.clear()
    else:
        rename_uses(graph, LOGITS, LOGITS + FULL_SUFFIX, outputs_too=True)
        b.node("Slice", [LOGITS + FULL_SUFFIX, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1])],
               LOGITS)
        export = list(graph.node)
    nodes = [*head, *export, *tail, *b.nodes]
    del graph.node[:]
    graph.node.extend(nodes)
    for value in graph.output:
        pair_of = next((p for p in shape.pairs if p.present == value.name), None)
        if pair_of is not None:
            set_shape(value, (batch, *pair_of.shape[1:]))
        elif value.name == LOGITS:
            set_shape(value, (batch, 1, shape.vocab))


def row_wise_head(graph: onnx.GraphProto, weight_dims: Mapping[str, tuple[int, ...]] | None = None
                  ) -> onnx.NodeProto | None:
    """The node that computes the logits [B, S, vocab] where each of their rows is that node over the same row of its
    first input alone, so that the last row of the logits is the node over its input's last row: a MatMul whose
    weight is a 2-D initializer (the input then has the logits' rank, S on axis 1), or a com.microsoft MatMulNBits
    without g_idx (the input has the output's rank); else None. ``weight_dims``: the dims of initializers left out
    of ``graph`` (``layout.read``'s)."""
    output = next((o for o in graph.output if o.name == LOGITS), None)
    if output is None or len(output.type.tensor_type.shape.dim) != 3:
        return None
    makers = [n for n in graph.node if LOGITS in n.output]
    if len(makers) != 1 or list(makers[0].output) != [LOGITS] or any(LOGITS in n.input for n in graph.node):
        return None
    node: onnx.NodeProto = makers[0]
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
        weight = initializer_dims(graph, weight_dims, node.input[1])
        return node if weight is not None and len(weight) == 2 else None
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and len(node.input) >= 3 \
            and not any(node.input[4:5]):
        return node
    return None


def initializer_dims(graph: onnx.GraphProto, weight_dims: Mapping[str, tuple[int, ...]] | None, name: str
                     ) -> tuple[int, ...] | None:
    """The dims of initializer ``name``: the graph's own, else ``weight_dims``' (those left out of it); None where
    it is neither."""
    kept = next((tuple(i.dims) for i in graph.initializer if i.name == name), None)
    return kept if kept is not None else (weight_dims or {}).get(name)


def _with_position(model: onnx.ModelProto, shape: Layout, batch: int | None, sequence: int | None
                   ) -> tuple[onnx.ModelProto, onnx.GraphProto, GraphBuilder]:
    """A copy of ``model`` whose inputs are ``input_ids`` [batch, sequence], ``position`` [batch] and the cache at
    max_length rows: the export's own inputs that the position replaces (the mask, the position ids) become
    tensors computed in front of it (by the caller, with the builder returned)."""
    form: onnx.ModelProto = onnx_proto.messages().ModelProto()
    form.CopyFrom(model)
    graph = form.graph
    kept = [v for v in graph.input if v.name not in (ATTENTION_MASK, POSITION_IDS)]
    del graph.input[:]
    graph.input.extend(kept)
    ids = next(v for v in graph.input if v.name == INPUT_IDS)
    set_shape(ids, (batch, sequence))
    if sequence is None:
        ids.type.tensor_type.shape.dim[1].dim_param = "sequence_length"
    rows: list[int | str | None] = [batch if batch is not None else BATCH_DIM]
    graph.input.append(make_tensor_value_info(POSITION, TensorProto.INT64, rows))
    for pair in shape.pairs:
        set_shape(next(v for v in graph.input if v.name == pair.past), (batch, *pair.shape[1:]))
    return form, graph, GraphBuilder(graph, PREFIX)


def _concat_cache(graph: onnx.GraphProto, b: GraphBuilder, shape: Layout, s: str, rows: str, sliced: bool
                  ) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """The nodes before and after the export for a Concat cache: the mask, and each present scattered into its
    past. The export reads the whole cache under a mask over max_length + S rows, or (``sliced``) the cache's first
    position rows under a mask of ones."""
    max_length = shape.max_length
    zero, one = b.const(np.array(0, np.int64)), b.const(np.array(1, np.int64))
    # the mask from comparisons of one range (the QNN HTP computes an int64 ConstantOfShape of ones as zeros)
    if sliced:
        every_row = b.node("Range", [zero, b.node("Squeeze", [b.node("Add", [POSITION, s])]), one])
        visible = b.node("GreaterOrEqual", [every_row, zero])
        for pair in shape.pairs:
            used = b.node("Slice", [pair.past, b.const([0]), POSITION, b.const([2])])
            rename_uses(graph, pair.past, used, outputs_too=False)
    else:  # cache rows before the position, then every new token (the export makes it causal among them)
        every_row = b.node("Range", [zero, b.node("Add", [b.const(np.array(max_length, np.int64)),
                                                          b.node("Squeeze", [s])]), one])
        visible = b.node("Or", [b.node("Less", [every_row, POSITION]),
                                b.node("GreaterOrEqual", [every_row, b.const(np.array(max_length, np.int64))])])
    b.node("Unsqueeze", [b.node("Cast", [visible], to=TensorProto.INT64), b.const([0])], ATTENTION_MASK)

    # each present: the cache with the export's last S rows written at the new tokens' rows
    head = list(b.nodes)
    b.nodes.clear()
    ends = b.const([np.iinfo(np.int64).max])  # Slice clamps it: to the end
    start = POSITION if sliced else b.const([max_length])  # where the export's present has the new rows
    axis = b.const([2])
    index_shape = b.const([1, 1, -1, 1])
    for pair in shape.pairs:
        full = pair.present + FULL_SUFFIX
        rename_uses(graph, pair.present, full, outputs_too=True)
        new = b.node("Slice", [full, start, ends, axis])
        where = b.node("Expand", [b.node("Reshape", [rows, index_shape]), b.node("Shape", [new])])
        b.node("ScatterElements", [pair.past, where, new], pair.present, axis=2)
    tail = list(b.nodes)
    b.nodes.clear()
    return head, tail
