"""Whisper's step decoder in a static form for the pinned-shape (NPU) path: the self-attention cache at a fixed
``max_target_positions`` rows, so that every step is one compiled shape instead of a new one per length.

optimum's ``decoder_with_past_model.onnx`` takes the self-attention cache ``past_key_values.{i}.decoder.{key,value}``
[B, heads, P, head_dim] and reads its length P from the cache's shape: the position embedding's row is P (a Range
from ``Shape(past)[2]``), and the causal mask is built over P + 1 keys. It returns ``present.{i}.decoder.*``, the
cache grown by a row (a Concat). The derived form (``derive``) keeps the export's graph and changes three things:

- the cache inputs are [B, heads, max_length, head_dim] (max_length: the position embedding's rows, Whisper's
  ``max_target_positions``), rows at and past ``position`` unused;
- a new input ``position`` [1] (int64) is the row of the step's token: the position embedding's Gather reads row
  ``position`` (its index, computed from the cache's shape in the export, replaced);
- each self-attention's mask (the tensor added to its scores before the Softmax, built from the cache's shape in
  the export) is replaced by one over the max_length + 1 keys (the Concat of the cache and the new row): 0 for the
  rows before ``position`` and for the new row, the dtype's lowest value elsewhere (exactly 0 after the Softmax);
- the outputs are the logits and ``new_row.{i}.decoder.{key,value}`` [B, heads, 1, head_dim], the new row alone:
  the host writes it at row ``position`` of its cache (``WhisperModel``), so nothing but one row a layer leaves the
  engine each step.

The step's ids are [B, 1] (one token a row: beams advance together, so one position serves every row); the
cross-attention keys and values (``past_key_values.{i}.encoder.*``) are inputs as in the export. The nodes that
computed the export's own positions and masks are removed (nothing reads them).

Before first use the form is checked against the export (``check``): the export fed a growing cache, the form the
same rows in a cache of max_length rows whose unused rows are random noise (a mask that let one count shows), on
the CPU of the runner's engine (the graph npurt derived is checked, not a device's numerics), their logits and new
rows compared (``verify.Check``'s verdict and tolerance, kept beside the form). The generate path's checker
(``verify_child``) cannot run it: it feeds ``attention_mask`` and a cache of ``past_key_values.{i}.key`` alone,
where this decoder takes no mask and needs its cross-attention inputs.

    python static_cache.py JSON      (the check's child: prints one JSON verdict)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

INPUT_IDS = "input_ids"
POSITION = "position"
LOGITS = "logits"
NEW_ROW = "new_row."  # the outputs' prefix: new_row.{i}.decoder.{key,value}
FILE = "decoder_with_past_static.onnx"
_VERSION = 1  # of the derivation: a change here makes new cache entries
_SELF_PAST = re.compile(r"^past_key_values\.(\d+)\.decoder\.(key|value)$")
_CROSS_PAST = re.compile(r"^past_key_values\.(\d+)\.encoder\.(key|value)$")
_PREFIX = "__npurt_static_cache"
_BATCH = "batch_size"  # the rows' dim, open (one name on every port: the cache's rows are the ids' rows)
# ops between a self-attention's cache (the Concat's output) and its scores' MatMul in the exports npurt reads
_TO_SCORES = ("Transpose", "Mul", "Div", "Reshape", "Cast")


@dataclass(frozen=True)
class StepLayout:
    """What the static form is made of: the cache's rows, its (past name, new-row name) pairs by layer, and the
    cache's heads and head_dim."""

    max_length: int
    pairs: tuple[tuple[str, str], ...]
    heads: int
    head_dim: int

    def as_json(self) -> dict[str, object]:
        return {"max_length": self.max_length, "pairs": [list(p) for p in self.pairs], "heads": self.heads,
                "head_dim": self.head_dim}

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> StepLayout:
        return StepLayout(int(value["max_length"]), tuple((str(a), str(b)) for a, b in value["pairs"]),
                          int(value["heads"]), int(value["head_dim"]))


def derive(model: onnx.ModelProto, weight_dims: Mapping[str, tuple[int, ...]] | None = None) -> StepLayout:
    """Make ``model`` (optimum's decoder_with_past, weightless or not) the static form of the module, in place.
    ``weight_dims``: the dims of initializers left out of a weightless model. ValueError naming what does not fit
    (a port missing, no position embedding read from the cache's shape, an attention whose mask is not found)."""
    import numpy as np

    from ..onnx_build import GraphBuilder
    from ..onnx_graph import graph_inputs
    from ..onnx_proto import TensorProto, make_tensor_value_info, rename_uses, tensor_dtype_to_np_dtype

    graph = model.graph
    inputs = {v.name: v for v in graph_inputs(graph)}
    outputs = {v.name: v for v in graph.output}
    if INPUT_IDS not in inputs or LOGITS not in outputs:
        raise ValueError(f"not optimum's Whisper decoder_with_past: inputs {sorted(inputs)}, outputs {sorted(outputs)}")
    pasts = sorted((n for n in inputs if _SELF_PAST.match(n)), key=_layer_order)
    if not pasts:
        raise ValueError("no past_key_values.{i}.decoder.{key,value} inputs (optimum's decoder_with_past expected)")
    odd = sorted(set(inputs) - {INPUT_IDS, *pasts} - {n for n in inputs if _CROSS_PAST.match(n)})
    if odd:
        raise ValueError(f"decoder input {odd[0]!r} is not one the static form feeds (input_ids, "
                         "past_key_values.{i}.decoder/encoder.{key,value})")
    for past in pasts:
        if past.replace("past_key_values.", "present.", 1) not in outputs:
            raise ValueError(f"past input {past!r} has no present output to pair with")
    dims = inputs[pasts[0]].type.tensor_type.shape.dim
    if len(dims) != 4 or not dims[1].dim_value or not dims[3].dim_value:
        raise ValueError(f"past input {pasts[0]!r} is not [batch, heads, length, head_dim] with heads and head_dim "
                         "fixed")
    heads, head_dim = int(dims[1].dim_value), int(dims[3].dim_value)
    elem_type = inputs[pasts[0]].type.tensor_type.elem_type
    constants = {t.name: tuple(t.dims) for t in graph.initializer} | dict(weight_dims or {})
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    # the position embedding: the Gather of a 2-d table whose index comes from the cache's shape
    def reads_cache_shape(name: str) -> bool:
        seen, todo = set(), [name]
        while todo:
            node = producer.get(todo.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "Shape" and node.input[0] in pasts:
                return True
            todo.extend(node.input)
        return False

    gathers = [n for n in graph.node if n.op_type == "Gather" and len(constants.get(n.input[0], ())) == 2
               and reads_cache_shape(n.input[1])]
    if len(gathers) != 1:
        raise ValueError(f"{len(gathers)} position embeddings read from the cache's length (one expected: optimum's "
                         "Whisper decoder computes its positions from past_key_values' shape)")
    position_gather = gathers[0]
    max_length = int(constants[position_gather.input[0]][0])

    b = GraphBuilder(graph, _PREFIX)
    dtype = tensor_dtype_to_np_dtype(elem_type)
    keys = np.arange(max_length + 1, dtype=np.int64)  # the cache's rows, then the new row (the export's Concat)
    visible = b.node("Or", [b.node("Less", [b.const(keys), POSITION]), b.const(keys == max_length)])
    additive = b.node("Where", [visible, b.const(np.zeros(1, dtype)), b.const(np.full(1, np.finfo(dtype).min, dtype))])
    mask = b.node("Reshape", [additive, b.const([1, 1, 1, max_length + 1])])
    rows = b.node("Expand", [b.node("Unsqueeze", [POSITION, b.const([0])]), b.node("Shape", [INPUT_IDS])])
    position_gather.input[1] = rows

    pairs = []
    for past in pasts:
        present = past.replace("past_key_values.", "present.", 1)
        if past.endswith(".key"):
            _mask_attention(present, readers, mask, b)
        full = f"{_PREFIX}_{present}"
        rename_uses(graph, present, full, outputs_too=True)
        new_row = NEW_ROW + past.removeprefix("past_key_values.")
        b.node("Slice", [full, b.const([max_length]), b.const([max_length + 1]), b.const([2])], new_row)
        pairs.append((past, new_row))
    graph.node.extend(b.nodes)

    # the ports: ids [B, 1], the position [1], the cache at max_length rows; the new rows out
    _set_dims(inputs[INPUT_IDS], (_BATCH, 1))
    graph.input.append(make_tensor_value_info(POSITION, TensorProto.INT64, [1]))
    for past in pasts:
        _set_dims(inputs[past], (_BATCH, heads, max_length, head_dim))
    kept = [o for o in graph.output if not o.name.startswith("present.")]
    del graph.output[:]
    graph.output.extend(kept)
    for _, new_row in pairs:
        graph.output.append(make_tensor_value_info(new_row, elem_type, [_BATCH, heads, 1, head_dim]))
    del graph.value_info[:]  # (the export's inferred shapes name the grown length: stale)
    _prune(graph)
    return StepLayout(max_length, tuple(pairs), heads, head_dim)


def _mask_attention(present_key: str, readers: Mapping[str, list[onnx.NodeProto]], mask: str,
                    b: Any) -> None:
    """The self-attention over ``present_key`` (the Concat of the cache and the new row) reads ``mask`` in place of
    the export's: its scores' MatMul found through the ops that transpose and scale the keys, then the Add of the
    export's mask before the Softmax (its mask input replaced), or the Softmax itself (an Add put in front)."""
    todo, matmuls = [present_key], []
    while todo:
        for node in readers.get(todo.pop(), []):
            if node.op_type == "MatMul":
                matmuls.append(node)
            elif node.op_type in _TO_SCORES:
                todo.append(node.output[0])
    if len(matmuls) != 1:
        raise ValueError(f"{present_key}: {len(matmuls)} score MatMuls read the self-attention's keys (one expected)")
    scores = matmuls[0].output[0]
    after = readers.get(scores, [])
    if len(after) == 1 and after[0].op_type == "Softmax":
        added = b.node("Add", [scores, mask])
        after[0].input[0] = added
        return
    if len(after) == 1 and after[0].op_type == "Add" and \
            [n.op_type for n in readers.get(after[0].output[0], [])] == ["Softmax"]:
        add = after[0]
        add.input[1 if add.input[0] == scores else 0] = mask
        return
    raise ValueError(f"{present_key}: the self-attention's scores go to {[n.op_type for n in after]}, not a Softmax "
                     "(through the Add of a mask)")


def _set_dims(value: onnx.ValueInfoProto, dims: tuple[int | str, ...]) -> None:
    """``value``'s dims: an int fixes one, a str names it (one name for the batch on every port)."""
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d


def _prune(graph: onnx.GraphProto) -> None:
    """Remove the nodes nothing reads (the export's own positions and masks, now replaced), and order the rest so
    that each comes after what it reads (the nodes added went to the end)."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(_ordered(list(graph.node))):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))


def _ordered(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each comes after the nodes that write its inputs (their order kept otherwise)."""
    written = {out: node for node in nodes for out in node.output}
    done: set[int] = set()
    order: list[onnx.NodeProto] = []
    for start in nodes:
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if expanded:
                done.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((written[name], False) for name in reversed(node.input)
                         if name in written and id(written[name]) not in done)
    return order


def _layer_order(name: str) -> tuple[int, str]:
    found = _SELF_PAST.match(name)
    assert found is not None
    return int(found.group(1)), found.group(2)


def folder_for(with_past: Path, cache_dir: Path, copy_weights: bool = False) -> Path:
    """The folder of ``cache_dir`` that keeps the static form of this export (``openvino_state.folder_for``'s, keyed
    also by whether its weights are copied: an NPU's runner loads the form with onnx, which refuses hard-linked
    data)."""
    from .openvino_state import folder_for as keyed  # (here: this file also runs alone, as the check's child)

    return keyed(with_past, cache_dir, ("static", _VERSION, copy_weights))


_LAYOUT = "static_layout.json"


def static_decoder(with_past: Path, folder: Path, *, copy_weights: bool = False) -> tuple[Path, StepLayout]:
    """The static form of ``with_past`` in ``folder`` (derived where it is not there yet: from the export's graph
    without its weights, its weights the export's own bytes linked beside it, or copied with ``copy_weights``: a
    runner that edits the graph for an NPU's views loads it with onnx, which takes no hard link), and its layout.
    NpuUnsupportedError where the export is not one ``derive`` understands."""
    from ..types import NpuError, NpuUnsupportedError

    path = folder / FILE
    if path.exists():
        try:
            return path, StepLayout.from_json(json.loads((folder / _LAYOUT).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    from .. import onnx_external, onnx_graph
    from ..generate.verify import keep_json

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NpuError(f"cannot make the static form's folder {folder}: {e}") from None
    try:
        skeleton = onnx_graph.read_skeleton(with_past)
        model = skeleton.model
    except (OSError, ValueError) as e:
        raise NpuError(f"cannot read ONNX model {with_past}: {e}") from None
    try:
        layout = derive(model, skeleton.weight_dims)
    except ValueError as e:
        raise NpuUnsupportedError(f"{with_past.name}: no static self-attention cache: {e}") from None
    try:
        onnx_external.write(model, skeleton, path, link=not copy_weights)
        keep_json(folder / _LAYOUT, layout.as_json())
    except (OSError, ValueError) as e:
        raise NpuError(f"cannot write the static form of {with_past.name} into {folder}: {e}") from None
    return path, layout


def check(export: Path, derived: Path, layout: StepLayout, engine: str, folder: Path) -> Any:
    """The check of ``derived`` against ``export`` (a ``verify.Check``: its verdict kept in ``folder`` as
    ``verified-<engine>-whisper-step.json``, else a child process running it now; ``Check.verdict`` waits for it and
    raises NpuUnsupportedError where the form's logits or new rows are not the export's). ``engine``: "onnxruntime"
    or "openvino" (its CPU plug-in at f32), the engine the runner runs the form on."""
    from ..generate import verify

    verdict_path = folder / f"verified-{engine}-whisper-step.json"
    try:
        return verify.Check(export, engine, verdict_path, json.loads(verdict_path.read_text()))
    except (OSError, ValueError):
        pass
    args = {"export": str(export), "derived": str(derived), "engine": engine, "layout": layout.as_json(),
            "tolerance": verify.TOLERANCE_F32}
    child = subprocess.Popen([sys.executable, str(Path(__file__)), json.dumps(args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    return verify.Check(export, engine, verdict_path, None, child, _SEED_ROWS)


# -- the check's child: the export and the form on one engine, no npurt imported --------------------------------

_SEED_ROWS = 3  # the prompt's rows the first scenario starts from
_FRAMES = 7  # the cross-attention's frames (any: the export and the form leave them open)


def _compare(args: Mapping[str, Any]) -> dict[str, object]:
    """Both forms through the same scenarios (the module); the verdict as ``verify.Check`` reads it."""
    import numpy as np
    import onnxruntime as ort

    layout = StepLayout.from_json(args["layout"])
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")  # (a few runs do not repay it)
    reference = ort.InferenceSession(args["export"], options, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    cross = [i.name for i in reference.get_inputs() if _CROSS_PAST.match(i.name)]
    if args["engine"] == "openvino":
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(args["derived"]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})

        def run_form(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            out = compiled.create_infer_request().infer(feeds)
            return {k.get_any_name(): np.asarray(v) for k, v in out.items()}
    else:
        session = ort.InferenceSession(args["derived"], options, providers=["CPUExecutionProvider"])
        form_names = [o.name for o in session.get_outputs()]

        def run_form(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(form_names, session.run(form_names, feeds)))

    rng = np.random.default_rng(0)
    shape = (1, layout.heads)
    cross_kv = {n: rng.standard_normal((*shape, _FRAMES, layout.head_dim)).astype(np.float32) for n in cross}
    vocab = int(reference.get_outputs()[0].shape[-1] or 2)
    worst, where, scale = 0.0, "", 1.0
    failed: str | None = None
    # (seed rows, steps): greedy steps of one row, two beams from it, then reordered; and the position table's last
    # rows
    Step = tuple[list[int | None], list[int]]  # (ids: None the greedy pick, each row's source row)
    one_row: Step = ([None], [0])
    first_beams: Step = ([11, 220], [0, 0])
    reordered: Step = ([None, None], [1, 0])
    Scenario = tuple[int, list[Step]]
    scenarios: list[Scenario] = [(_SEED_ROWS, [one_row, one_row, one_row, first_beams, reordered,
                                               ([None, None], [0, 0])]),
                                 (layout.max_length - 3, [one_row, one_row, one_row])]
    for number, (seed_rows, steps) in enumerate(scenarios):
        grown = {p: rng.standard_normal((*shape, seed_rows, layout.head_dim)).astype(np.float32)
                 for p, _ in layout.pairs}
        static = {p: rng.standard_normal((*shape, layout.max_length, layout.head_dim)).astype(np.float32)
                  for p, _ in layout.pairs}  # noise in every row the form must not read
        for p in static:
            static[p][:, :, :seed_rows] = grown[p]
        last: np.ndarray | None = None
        for k, (ids, order) in enumerate(steps):
            picks = np.asarray(order)
            grown = {p: np.ascontiguousarray(v[picks]) for p, v in grown.items()}
            static = {p: np.ascontiguousarray(v[picks]) for p, v in static.items()}
            chosen = [i if i is not None else int(np.argmax(last[picks[r]])) if last is not None else 50257 % vocab
                      for r, i in enumerate(ids)]
            tokens = np.array([[i % vocab] for i in chosen], np.int64)
            wide = {n: np.ascontiguousarray(np.repeat(v, len(ids), axis=0)) for n, v in cross_kv.items()}
            position = int(next(iter(grown.values())).shape[2])
            want = dict(zip(names, reference.run(names, {INPUT_IDS: tokens, **grown, **wide})))
            got = run_form({INPUT_IDS: tokens, POSITION: np.array([position], np.int64), **static, **wide})
            expected = np.asarray(want[LOGITS][:, -1], np.float64)
            scale = max(scale, float(np.max(np.abs(expected))))
            diffs = [float(np.max(np.abs(np.asarray(got[LOGITS][:, -1], np.float64) - expected)))]
            for past, new_row in layout.pairs:
                present = want[past.replace("past_key_values.", "present.", 1)]
                diffs.append(float(np.max(np.abs(got[new_row][:, :, 0] - present[:, :, -1]))))
            diff = max(diffs)
            place = f"scenario {number} step {k} (position {position}, {len(ids)} row(s))"
            if diff > worst or not where:
                worst, where = diff, place
            if diff > args["tolerance"] * max(1.0, float(np.max(np.abs(expected)))) and failed is None:
                failed = place
            grown = {p: want[p.replace("past_key_values.", "present.", 1)] for p in grown}
            for (past, new_row) in layout.pairs:
                static[past][:, :, position] = got[new_row][:, :, 0]
            last = expected
    # (verify.Check adds prompt_tokens and its own step count; "runs" is this check's)
    return {"ok": failed is None, "where": failed or where, "max_diff": worst,
            "tolerance": args["tolerance"] * scale, "proof": "whisper-step", "runs": sum(len(s) for _, s in scenarios)}


def main(argv: list[str]) -> int:
    try:
        print(json.dumps(_compare(json.loads(argv[0]))))
    except Exception as e:  # noqa: BLE001 - any failure is the one line the parent reports
        print(" ".join(str(e).split())[:500] or type(e).__name__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
