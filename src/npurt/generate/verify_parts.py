"""The check of a GroupQueryAttention static form against its export by its parts, in the runner's own process
(issue 57: a proof as strong as running both models, without a second model's load and memory).

``static_form`` wraps ONNX Runtime GenAI's builder export without touching it: a head computes the mask and the
position ids from ``position``, a Slice keeps the logits' last row, and each past is bound with its present to one
buffer of max_length rows (GroupQueryAttention's own shared-buffer mode). So the derived form gives the export's
logits wherever:

1. its nodes are the export's, in order, between npurt's head and the slice, over the export's own weights (the same
   bytes of the same files, the same dims) and inputs: read from both graphs. Where the form runs a row-wise LM head
   over its input's last row (``static_form.row_wise_head``), the slice is that input's, right before the head;
2. the cache reaches nothing but GroupQueryAttention: each past is read only as a node's past key or value, each
   present is only that node's output, read by nothing: read from the graph;
3. the head feeds the export what it is fed without the form (a mask of ones over position + S rows, position ids
   position .. position + S - 1) and the slice is the last row: run on the engine, together with what the export
   computes from them for each GroupQueryAttention (its seqlens_k and total_sequence_length); a row-wise LM head
   gives the last row of S rows as it gives that row alone: its operator and attributes over its input's width, on
   random weights (fewer columns) and rows, run on the engine for each S;
4. each GroupQueryAttention configuration of the graph (its attributes, its rotary tables) gives the same output and
   the same cache rows with past and present in one buffer of max_length rows, the rows past the position holding
   noise, as with a past of position rows: run on the engine with random inputs on the prompt, chunk and step
   shapes a runner lays, and the last row of the buffer.

Every other node then sees the same values either way, so 1-4 give the export's logits at every layer for any ids.
The full check (``verify_child``: both models in a child process, ~1-1.5 s beside the load and a second model's
memory on a 540 MB export) shows it on one prompt; these parts take ~0.1 s. A form outside 1 and 2 (another
attention, a past read elsewhere, copied weights) gets the full check.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import onnx_external, onnx_proto
from ..onnx_graph import Skeleton, read_skeleton
from ..onnx_proto import TensorProto
from .layout import ATTENTION_MASK, GQA_OP, INPUT_IDS, LOGITS, POSITION, POSITION_IDS, Layout
from .static_form import FULL_SUFFIX, LAST_SUFFIX, initializer_dims, row_wise_head

if TYPE_CHECKING:
    import onnx

_MS = "com.microsoft"
_NOISE = 7.0  # added to the buffer's rows past the position: any read of them moves the output
_HEAD_COLUMNS = 64  # the columns of a row-wise LM head's check (each output column is its own dot product)


def check(export: Path, derived: Path, shape: Layout, chunk: int, tolerance: float) -> dict[str, object] | None:
    """The verdict (``ok``, ``where``, ``max_diff``, ``tolerance``, ``proof``, ``configurations``, ``shapes``; and
    ``lm_head``, its operator, where the form runs a row-wise LM head on the last row) of the derived form by its
    parts, or None where the form is not one they prove (the full check decides then)."""
    try:
        e_skeleton, d_skeleton = read_skeleton(export), read_skeleton(derived)
    except (OSError, ValueError):
        return None
    e_model = e_skeleton.model
    e_graph, d_graph = e_model.graph, d_skeleton.model.graph
    weight_dims = e_skeleton.weight_dims
    wrapped = _wrapped(e_graph, d_graph, weight_dims)
    gqa = [n for n in e_graph.node if n.op_type == GQA_OP and n.domain == _MS]
    try:
        places = onnx_external.places(e_skeleton)
    except (OSError, ValueError):
        return None
    if wrapped is None or not gqa or not _same_weights(e_skeleton, d_skeleton, e_graph, d_graph, places) \
            or not _cache_only_in_attention(e_graph, shape) or not all(_plain(n, shape) for n in gqa):
        return None
    head, tail, lm_head, slicer = wrapped
    opsets = list(e_model.opset_import)
    cut = _Cut.of(e_graph, lm_head, weight_dims)
    if cut is None:
        return None
    control = _control_model(e_graph, d_graph, head, tail, gqa, shape, opsets, cut, slicer)
    if control is None:
        return None
    import onnxruntime as ort

    try:
        shapes = _shapes(shape.max_length, chunk)
        session = ort.InferenceSession(control.SerializeToString(), _one_thread(), providers=["CPUExecutionProvider"])
        worst: dict[str, Any] = {"ok": True, "where": "", "max_diff": 0.0, "tolerance": tolerance, "proof": "parts",
                                 "shapes": len(shapes)}
        controls = []
        for position, s in shapes:
            values, wrong = _run_control(session, shape, cut, position, s)
            if wrong:
                return {**worst, "ok": False, "where": f"npurt's ports at position {position} with {s} new: {wrong}",
                        "max_diff": float("inf")}
            controls.append(values)
        configurations: dict[bytes, list[onnx.NodeProto]] = {}
        for node in gqa:
            key = b"".join([a.SerializeToString() for a in node.attribute] + [n.encode() for n in node.input[7:9]]
                           + [b"packed" if not node.input[1] else b""])
            configurations.setdefault(key, []).append(node)
        worst["configurations"] = len(configurations)
        for nodes in configurations.values():
            _attention_modes(nodes, e_skeleton, e_graph, places, shape, shapes, controls, worst, opsets)
        if lm_head is not None:
            worst["lm_head"] = lm_head.op_type
            _head_rows(lm_head, e_skeleton, e_graph, cut.width, sorted({s for _, s in shapes}), worst, opsets)
    except Exception:  # noqa: BLE001 - a part the engine cannot run: the full check decides (and says why)
        return None
    return worst


def _one_thread() -> Any:
    """Session options for the parts' small graphs: the calling thread alone. A pool's threads would spin after each
    run (ONNX Runtime's default) on the cores the rest of the load needs, for runs of well under a millisecond."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def _wrapped(e_graph: onnx.GraphProto, d_graph: onnx.GraphProto, weight_dims: dict[str, tuple[int, ...]]
             ) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto], onnx.NodeProto | None,
                        onnx.NodeProto | None] | None:
    """The derived graph's nodes before and after the export's own (its logits renamed as static_form renames them,
    or its row-wise LM head over its input's last row: that head, the export's, and the derived graph's slice,
    returned), where the export's nodes are there unchanged and in order, and its inputs are the export's with the
    position in place of the mask and the position ids."""
    lm_head, cut = _sliced_head(e_graph, d_graph, weight_dims)
    export = onnx_proto.make_graph(e_graph.node, e_graph.name, [], [])  # (its nodes copied)
    if lm_head is None:
        onnx_proto.rename_uses(export, LOGITS, LOGITS + FULL_SUFFIX, outputs_too=True)
    renamed = []
    for node, copy in zip(e_graph.node, export.node):
        if node is lm_head:  # the slice of its input's last row right before it, which it reads
            assert cut is not None
            renamed.append(cut)
            copy.input[0] = cut.output[0]
        renamed.append(copy)
    nodes = list(d_graph.node)
    start = next((h for h in range(len(nodes) - len(renamed) + 1) if nodes[h] == renamed[0]), None)
    if start is None or nodes[start:start + len(renamed)] != renamed:
        return None
    head, tail = nodes[:start], nodes[start + len(renamed):]
    e_initializers = {i.name for i in e_graph.initializer}
    e_inputs = [i.name for i in e_graph.input if i.name not in e_initializers]
    d_initializers = {i.name for i in d_graph.initializer}
    d_inputs = [i.name for i in d_graph.input if i.name not in d_initializers]
    replaced = {ATTENTION_MASK, POSITION_IDS}
    if [n for n in e_inputs if n not in replaced] + [POSITION] != d_inputs:
        return None
    made = {o for n in head for o in n.output}
    if not (replaced & set(e_inputs)) <= made or not all(set(n.input) <= made | d_initializers | {INPUT_IDS, POSITION}
                                                       for n in head):
        return None
    made_after = {o for n in tail for o in n.output}
    if lm_head is not None:
        return (head, tail, lm_head, cut) if not tail else None  # (the logits are the head's own output)
    if LOGITS not in made_after or not all(set(n.input) <= made_after | d_initializers | {LOGITS + FULL_SUFFIX}
                                           for n in tail):
        return None
    return head, tail, None, None


def _sliced_head(e_graph: onnx.GraphProto, d_graph: onnx.GraphProto, weight_dims: dict[str, tuple[int, ...]]
                 ) -> tuple[onnx.NodeProto | None, onnx.NodeProto | None]:
    """The export's row-wise LM head and the derived graph's Slice of its input's last row (else None, None): a
    Slice node of the standard domain reading the head's input, with that one output (that the head reads it in
    its place, right after it, is the caller's match of the export's nodes)."""
    lm_head = row_wise_head(e_graph, weight_dims)
    if lm_head is None:
        return None, None
    rows = lm_head.input[0]
    cut = next((n for n in d_graph.node if rows + LAST_SUFFIX in n.output), None)
    if cut is None or cut.op_type != "Slice" or cut.domain not in ("", "ai.onnx") \
            or list(cut.output) != [rows + LAST_SUFFIX] or not cut.input or cut.input[0] != rows:
        return None, None
    return lm_head, cut


def _same_weights(e_skeleton: Skeleton, d_skeleton: Skeleton, e_graph: onnx.GraphProto, d_graph: onnx.GraphProto,
                  theirs: dict[str, tuple[Path, int, int] | None]) -> bool:
    """The derived form's weights are the export's bytes (the same file, offset and length: a hard link of it) at
    the same dims, and the export's small initializers are in it unchanged."""
    if set(d_skeleton.weights) != set(e_skeleton.weights):
        return False
    mine = onnx_external.places(d_skeleton)
    same_files: dict[tuple[Path, Path], bool] = {}
    for name, weight in d_skeleton.weights.items():
        other = e_skeleton.weights[name]
        here, there = mine[name], theirs[name]
        if (weight.elem_type, weight.dims) != (other.elem_type, other.dims) or here is None or there is None \
                or here[1:] != there[1:]:
            return False
        files = (here[0], there[0])
        if files not in same_files:
            same_files[files] = os.path.samefile(*files)
        if not same_files[files]:
            return False
    kept = {i.name: i for i in d_graph.initializer}
    return all(kept.get(i.name) == i for i in e_graph.initializer)


def _cache_only_in_attention(graph: onnx.GraphProto, shape: Layout) -> bool:
    """Each past is read only as a GroupQueryAttention's past key (input 3) or value (4); each present is only such
    a node's present key (output 1) or value (2), read by no node."""
    pasts = {p.past: p for p in shape.pairs}
    presents = {p.present for p in shape.pairs}
    made = set()
    for node in graph.node:
        attention = node.op_type == GQA_OP and node.domain == _MS
        for i, name in enumerate(node.input):
            if name in presents or (name in pasts and not (attention and i in (3, 4))):
                return False
        for i, name in enumerate(node.output):
            if name in presents:
                if not (attention and i in (1, 2)):
                    return False
                made.add(name)
    return made == presents


def _plain(node: onnx.NodeProto, shape: Layout) -> bool:
    """A GroupQueryAttention of the inputs these parts feed (query, key, value, the cache, seqlens_k,
    total_sequence_length, the rotary tables) and its three outputs, over the layout's heads."""
    kv = next((a.i for a in node.attribute if a.name == "kv_num_heads"), None)
    return (len(node.output) <= 3 and not any(node.input[9:]) and len(node.input) >= 7 and all(node.input[3:7])
            and kv == shape.kv_heads)


def _cone(graph: onnx.GraphProto, targets: set[str], leaves: set[str]) -> list[onnx.NodeProto] | None:
    """The export's nodes that compute ``targets`` from ``leaves`` (and small initializers), in graph order; None
    where they need anything else (a weight, the cache)."""
    producer = {o: n for n in graph.node for o in n.output}
    small = {i.name for i in graph.initializer}
    needed: set[int] = set()
    todo = list(targets)
    while todo:
        name = todo.pop()
        if name in leaves or name in small or not name:
            continue
        node = producer.get(name)
        if node is None:
            return None
        if id(node) not in needed:
            needed.add(id(node))
            todo.extend(node.input)
    return [n for n in graph.node if id(n) in needed]


class _Cut:
    """Where the derived form takes the last row: of the export's full logits (``source`` its logits renamed, the
    slice after the export), or of a row-wise LM head's input (the slice before the head); ``width``: that tensor's
    last dim, ``elem_type`` its type."""

    def __init__(self, source: str, rows: str, width: int, elem_type: int) -> None:
        self.source, self.rows, self.width, self.elem_type = source, rows, width, elem_type

    @staticmethod
    def of(e_graph: onnx.GraphProto, lm_head: onnx.NodeProto | None, weight_dims: dict[str, tuple[int, ...]]
           ) -> _Cut | None:
        logits = next(o for o in e_graph.output if o.name == LOGITS)
        elem_type = logits.type.tensor_type.elem_type  # (a row-wise head's output has its input's type)
        dims = logits.type.tensor_type.shape.dim
        if lm_head is None:
            vocab = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else 0
            return _Cut(LOGITS + FULL_SUFFIX, LOGITS, vocab, elem_type) if vocab else None
        width = _head_width(lm_head, e_graph, weight_dims)
        return _Cut(lm_head.input[0], lm_head.input[0] + LAST_SUFFIX, width, elem_type) if width else None


def _head_width(node: onnx.NodeProto, graph: onnx.GraphProto, weight_dims: dict[str, tuple[int, ...]]) -> int:
    """A row-wise LM head's input width (K): a MatMul's weight's rows, a MatMulNBits' attribute K (0: not known)."""
    if node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "K"), 0)
    dims = initializer_dims(graph, weight_dims, node.input[1])
    return int(dims[0]) if dims else 0


def _control_model(e_graph: onnx.GraphProto, d_graph: onnx.GraphProto, head: list[onnx.NodeProto],
                   tail: list[onnx.NodeProto], gqa: list[onnx.NodeProto], shape: Layout,
                   opsets: list[onnx.OperatorSetIdProto], cut: _Cut, slicer: onnx.NodeProto | None
                   ) -> onnx.ModelProto | None:
    """npurt's head and slice with the export's nodes that compute each GroupQueryAttention's seqlens_k and
    total_sequence_length from the mask and ids: inputs the ids, the position and the export's full logits;
    outputs the mask, the position ids, the logits and those control values. Where the form slices a row-wise LM
    head's input (``slicer``, ``_wrapped``'s), that slice in place of the tail, on that input."""
    targets = {n.input[i] for n in gqa for i in (5, 6)}
    cone = _cone(e_graph, targets, {INPUT_IDS, ATTENTION_MASK, POSITION_IDS})
    if cone is None:
        return None
    nodes = [*head, *cone, *tail, *([slicer] if slicer is not None else [])]
    used = {name for n in nodes for name in n.input}
    inputs = [*(next(i for i in d_graph.input if i.name == name) for name in (INPUT_IDS, POSITION)),
              onnx_proto.make_tensor_value_info(cut.source, cut.elem_type, [1, None, cut.width])]
    outputs = [onnx_proto.make_empty_value_info(name)
               for name in [ATTENTION_MASK, *([POSITION_IDS] if shape.has_position_ids else []), cut.rows,
                            *sorted(targets)]]
    graph = onnx_proto.make_graph(nodes, "npurt_ports", inputs, outputs,
                                  [i for i in d_graph.initializer if i.name in used])
    return _model(graph, opsets)


def _model(graph: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto]) -> onnx.ModelProto:
    """A model of ``graph`` at the export's opsets (the derived form's head is made at them too)."""
    return onnx_proto.make_model(graph, opsets, ir_version=8)


def _shapes(max_length: int, chunk: int) -> list[tuple[int, int]]:
    """(position, new rows) a runner lays: a prompt in one run, in chunks (the last one overlapping rows already
    there, as pinned shapes lay it), steps after it, and the buffer's last row."""
    length = max(1, min(chunk + 3, max_length - 4))
    chunk = max(1, min(chunk, length))
    wanted = [(0, length), (0, chunk), (chunk, length - chunk), (length - chunk, chunk), (length, 1),
              (length + 1, 1), (max_length - 1, 1)]
    return list(dict.fromkeys((p, s) for p, s in wanted if s >= 1 and p >= 0 and p + s <= max_length))


def _run_control(session: Any, shape: Layout, cut: _Cut, position: int, s: int
                 ) -> tuple[dict[str, np.ndarray], str]:
    """The control values at (position, s), and what npurt's ports got wrong ("" where nothing)."""
    rng = _Noise(position * 1000 + s)
    ids = rng.integers(shape.vocab or 2, (1, s))
    width = cut.width
    dtype = onnx_proto.tensor_dtype_to_np_dtype(cut.elem_type)
    # each element its own value where float32 holds them all exactly (made in float32: an int64 range converted is
    # ~4x the memory touched, ~10 ms a shape at a 49k vocabulary); else each row its index, exact in any float dtype
    # for these row counts (a range past float16's 65504 would be inf from its second row on: every row alike, and a
    # slice of the wrong row unseen)
    if dtype == np.float32 and s * width <= 2 ** 24:
        full = np.arange(s * width, dtype=dtype).reshape(1, s, width)
    else:
        full = np.broadcast_to(np.arange(s).astype(dtype)[None, :, None], (1, s, width)).copy()
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(names, {INPUT_IDS: ids, POSITION: np.array([position], np.int64),
                                                 cut.source: full})))
    if not np.array_equal(values[ATTENTION_MASK], np.ones((1, position + s), np.int64)):
        return values, f"attention_mask {values[ATTENTION_MASK].tolist()} is not ones over {position + s} rows"
    if shape.has_position_ids and not np.array_equal(values[POSITION_IDS],
                                                     np.arange(position, position + s, dtype=np.int64)[None]):
        return values, f"position_ids {values[POSITION_IDS].tolist()} are not {position} .. {position + s - 1}"
    if not np.array_equal(values[cut.rows], full[:, -1:]):
        return values, ("the logits are not the last row's" if cut.rows == LOGITS else
                        f"the LM head's input {cut.rows} is not its last row")
    return values, ""


def _attention_modes(nodes: Sequence[onnx.NodeProto], skeleton: Skeleton, graph: onnx.GraphProto,
                     places: dict[str, tuple[Path, int, int] | None], shape: Layout,
                     shapes: list[tuple[int, int]], controls: list[dict[str, np.ndarray]], worst: dict[str, Any],
                     opsets: list[onnx.OperatorSetIdProto]) -> None:
    """One GroupQueryAttention configuration (``nodes`` share it) with a past of position rows, and with past and
    present in one buffer of max_length rows: the output and the cache rows compared, into ``worst``."""
    import onnxruntime as ort

    node = nodes[0]
    pair = shape.pairs[0]
    dtype = onnx_proto.tensor_dtype_to_np_dtype(pair.elem_type)
    heads = next(a.i for a in node.attribute if a.name == "num_heads")
    kv, head_dim = shape.kv_heads, shape.head_dim
    packed = not node.input[1]
    tables = {}
    for name in node.input[7:9]:
        if name:
            tables[name] = _array(skeleton, graph, places, name)
    roles = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
             *node.input[7:9]]
    inputs = [r if (i >= 7 or node.input[i]) else "" for i, r in enumerate(roles[:len(node.input)])]
    one = onnx_proto.make_node(GQA_OP, inputs, ["output", "present_key", "present_value"], domain=_MS)
    one.attribute.extend(node.attribute)
    fed = [onnx_proto.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in inputs[:7] if n]
    for value in fed:  # (seqlens_k and total_sequence_length typed as the export computes them: _typed)
        value.type.tensor_type.elem_type = pair.elem_type
    model = _model(onnx_proto.make_graph([one], "npurt_attention", fed,
                                          [onnx_proto.make_empty_value_info(n) for n in one.output],
                                          [onnx_proto.from_array(a, n) for n, a in tables.items()]), opsets)
    session = ort.InferenceSession(_typed(model, controls[0], node), _one_thread(), providers=["CPUExecutionProvider"])
    width = (heads + 2 * kv) * head_dim if packed else heads * head_dim
    label = f"{GQA_OP} {node.name or node.output[0]}" + (f" (and {len(nodes) - 1} like it)" if len(nodes) > 1 else "")
    for (position, s), control in zip(shapes, controls):
        rng = _Noise(position * 1000 + s + 1)
        feeds: dict[str, np.ndarray] = {"query": rng.unit((1, s, width)).astype(dtype)}
        if not packed:
            feeds["key"] = rng.unit((1, s, kv * head_dim)).astype(dtype)
            feeds["value"] = rng.unit((1, s, kv * head_dim)).astype(dtype)
        feeds["seqlens_k"] = control[node.input[5]]
        feeds["total_sequence_length"] = control[node.input[6]]
        past = {n: rng.unit((1, kv, position, head_dim)).astype(dtype) for n in ("past_key", "past_value")}
        output, present_key, present_value = session.run(None, {**feeds, **past})
        # the same run with each past and its present one buffer of max_length rows (noise past the position)
        buffers = {}
        binding = session.io_binding()
        binding.bind_output("output")  # (the first output bound: copy_outputs_to_cpu's first)
        for name in ("past_key", "past_value"):
            buffer = rng.unit((1, kv, shape.max_length, head_dim)).astype(dtype) + dtype.type(_NOISE)
            buffer[:, :, :position] = past[name]
            buffers[name] = (buffer, buffer.copy())
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(name.replace("past", "present"), value)
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        session.run_with_iobinding(binding)
        shared = binding.copy_outputs_to_cpu()[0]
        rows = position + s
        scale = max(1.0, float(np.abs(output).max()))
        found = [("output", float(np.abs(np.asarray(shared, np.float64) - output).max()))]
        for name, present in (("past_key", present_key), ("past_value", present_value)):
            buffer, before = buffers[name]
            found.append((f"{name.replace('past', 'present')} rows 0..{rows - 1}",
                          float(np.abs(np.asarray(buffer[:, :, :rows], np.float64) - present).max())))
            if not np.array_equal(buffer[:, :, rows:], before[:, :, rows:]):
                found.append((f"{name} buffer rows past {rows - 1} (written)", float("inf")))
        for what, diff in found:
            diff = diff if np.isfinite(diff) else float("inf")
            tolerance = worst["tolerance"] * scale
            at = f"{label}, a past of {position} rows and {s} new: {what}"
            if worst["ok"] and (diff > tolerance or diff > worst["max_diff"]):
                worst["where"] = at
                worst["ok"] = diff <= tolerance
            worst["max_diff"] = max(worst["max_diff"], diff)


def _head_rows(node: onnx.NodeProto, skeleton: Skeleton, graph: onnx.GraphProto, width: int, rows: list[int],
               worst: dict[str, Any], opsets: list[onnx.OperatorSetIdProto]) -> None:
    """A row-wise LM head (its operator and attributes, over random weights of its input's width and at most
    _HEAD_COLUMNS columns) on the engine: the last of each count of rows as that row alone gives it, into
    ``worst``. ValueError where a weight is not an initializer or its dims are not per column (the caller's full
    check decides then)."""
    import onnxruntime as ort

    weight_dims = skeleton.weight_dims
    elem_types = {w.name: w.elem_type for w in skeleton.weights.values()}
    elem_types.update((i.name, i.data_type) for i in graph.initializer)  # (the graph's own first, as its dims)

    def weight(name: str) -> tuple[tuple[int, ...], int]:  # (dims, element type)
        dims = initializer_dims(graph, weight_dims, name)
        if dims is None:
            raise ValueError(f"{name}: not an initializer")
        return dims, elem_types[name]

    columns_of = (next((a.i for a in node.attribute if a.name == "N"), 0) if node.op_type == "MatMulNBits"
                  else weight(node.input[1])[0][-1])
    columns = min(columns_of, _HEAD_COLUMNS)
    if columns < 1:
        raise ValueError(f"{node.name}: its columns are not known")
    rng = _Noise(len(rows) * 7919 + width)
    weights: list[TensorProto] = []
    names: list[str] = []
    for name in node.input[1:]:
        names.append(name and f"w{len(names)}")
        if not name:
            continue
        dims, elem_type = weight(name)
        if not dims or (node.op_type == "MatMulNBits" and dims[0] % columns_of):
            raise ValueError(f"{name}: dims not per column")
        fewer = (dims[0], columns) if node.op_type == "MatMul" else (dims[0] // columns_of * columns, *dims[1:])
        dtype = onnx_proto.tensor_dtype_to_np_dtype(elem_type)
        values = (rng.integers(256, fewer).astype(dtype) if np.issubdtype(dtype, np.integer)
                  else (rng.unit(fewer) * np.float32(0.05)).astype(dtype))
        weights.append(onnx_proto.from_array(values, names[-1]))
    one = onnx_proto.make_node(node.op_type, ["rows", *names], ["out"], domain=node.domain or None)
    for attribute in node.attribute:
        copy = onnx_proto.make_attribute(attribute.name, columns) if attribute.name == "N" else attribute
        one.attribute.append(copy)
    logits = next(o for o in graph.output if o.name == LOGITS)
    dtype = onnx_proto.tensor_dtype_to_np_dtype(logits.type.tensor_type.elem_type)
    model = _model(onnx_proto.make_graph(
        [one], "npurt_lm_head", [onnx_proto.make_tensor_value_info("rows", logits.type.tensor_type.elem_type,
                                                                   [1, None, width])],
        [onnx_proto.make_empty_value_info("out")], weights), opsets)
    session = ort.InferenceSession(model.SerializeToString(), _one_thread(), providers=["CPUExecutionProvider"])
    label = f"the LM head {node.name or node.output[0]} ({node.op_type})"
    for s in rows:
        inputs = rng.unit((1, s, width)).astype(dtype)
        (every,) = session.run(None, {"rows": inputs})
        (last,) = session.run(None, {"rows": inputs[:, -1:]})
        diff = float(np.abs(np.asarray(every[:, -1:], np.float64) - last).max())
        diff = diff if np.isfinite(diff) else float("inf")
        tolerance = worst["tolerance"] * max(1.0, float(np.abs(every).max()))
        if worst["ok"] and (diff > tolerance or diff > worst["max_diff"]):
            worst["where"] = f"{label}: the last of {s} rows against that row alone"
            worst["ok"] = diff <= tolerance
        worst["max_diff"] = max(worst["max_diff"], diff)


class _Noise:
    """Pseudo-random values from a seed (SplitMix64 over a counter): numpy.random's import alone is ~20-40 ms of a
    cold load, for values whose distribution does not matter here (any generic values show a difference)."""

    _GAMMA = np.uint64(0x9E3779B97F4A7C15)
    _MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))

    def __init__(self, seed: int) -> None:
        self._seed = np.array([seed], np.uint64) * self._GAMMA  # (arrays wrap around silently; scalars warn)
        self._drawn = 0

    def _bits(self, count: int) -> np.ndarray:
        """``count`` uniform uint64 words, the next ones of this seed's stream."""
        z = self._seed + np.arange(self._drawn + 1, self._drawn + count + 1, dtype=np.uint64) * self._GAMMA
        self._drawn += count
        z = (z ^ (z >> np.uint64(30))) * self._MIX[0]
        z = (z ^ (z >> np.uint64(27))) * self._MIX[1]
        result: np.ndarray = z ^ (z >> np.uint64(31))
        return result

    def integers(self, high: int, shape: tuple[int, ...]) -> np.ndarray:
        """int64 values in [0, high)."""
        values: np.ndarray = (self._bits(int(np.prod(shape))) % np.uint64(high)).astype(np.int64)
        return values.reshape(shape)

    def unit(self, shape: tuple[int, ...]) -> np.ndarray:
        """float32 values of mean 0 and variance 1 (uniform over [-sqrt(3), sqrt(3))), two from each word."""
        count = int(np.prod(shape))
        words = self._bits((count + 1) // 2).view(np.uint32)[:count]
        scale = np.float32(2.0 * 3.0 ** 0.5 / (1 << 24))
        values: np.ndarray = ((words >> np.uint32(8)).astype(np.float32) * scale - np.float32(3.0 ** 0.5))
        return values.reshape(shape)


def _typed(model: onnx.ModelProto, control: dict[str, np.ndarray], node: onnx.NodeProto) -> bytes:
    """The one-node model with its control inputs typed as the export computes them."""
    for value in model.graph.input:
        if value.name == "seqlens_k":
            value.type.tensor_type.elem_type = onnx_proto.np_dtype_to_tensor_dtype(control[node.input[5]].dtype)
        elif value.name == "total_sequence_length":
            value.type.tensor_type.elem_type = onnx_proto.np_dtype_to_tensor_dtype(control[node.input[6]].dtype)
    data: bytes = model.SerializeToString()
    return data


def _array(skeleton: Skeleton, graph: onnx.GraphProto, places: dict[str, tuple[Path, int, int] | None], name: str
           ) -> np.ndarray:
    """An initializer's values: from the skeleton's graph where it kept it, else from the weight's bytes in its
    file."""
    kept = next((i for i in graph.initializer if i.name == name), None)
    if kept is not None:
        return onnx_proto.to_array(kept)
    weight = skeleton.weights[name]
    where = places[name]
    if where is None:
        raise ValueError(f"{name}: values in a typed field")
    path, offset, length = where
    dtype = np.dtype(onnx_proto.tensor_dtype_to_np_dtype(weight.elem_type))
    return np.fromfile(path, dtype, length // dtype.itemsize, offset=offset).reshape(weight.dims)
