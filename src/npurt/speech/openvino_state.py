"""Whisper's with-past decoder on OpenVINO with its self-attention cache as the compiled model's variables (OpenVINO
state: one set per infer request, so per npurt stream), as OpenVINO GenAI's decoder keeps it: the keys and values
stay inside the plug-in between steps instead of going out as ``present.*`` and back in as ``past_key_values.*``.

``decoder_with_past_model.onnx`` converted by OpenVINO's ONNX frontend, then per layer and per key / value:

- a variable named after the past input (``past_key_values.{i}.decoder.{key,value}``), read by a ReadValue whose
  initial value (what it gives after a reset, before any Assign) is a new input ``seed.past_key_values.{i}...``:
  the prompt's rows as ``decoder_model.onnx`` gave them;
- the variable read through ``Gather(axis 0)`` by a new input ``beam_idx`` int32 [rows] (each row's source row in
  the state: greedy [0], beam search each beam's parent, the first step of n rows [0] * n), which replaces the past
  input; the present (the cache grown by a row) is Assigned back, and is no longer an output.

The cross-attention keys and values stay inputs (computed once a window by ``decoder_model.onnx``); one row of them
serves every row (the attention broadcasts the batch), so beam search does not copy them. Outputs: the logits alone.
Each attention becomes one ScaledDotProductAttention (``_attention_as_sdpa``): the CPU plug-in then fuses the
self-attention's variable, Gather and Concat into its stateful attention (the cache grown in place) and reads the
cross-attention keys as they are, where the export transposed and scaled them every step; the logits read the
token embedding's table (``_tied_logits``: Whisper ties them; one copy of the vocabulary's weights, not two). The
plug-in runs the form with its cache at f32 (``ENGINE_OPTIONS``: its default compresses a stateful attention's cache
to u8). Measured on the shared 2-core VM (load average 5, the two interleaved, every input bound once, synchronous
infer()): a step of tiny.en 15.9 ms with the export's attention, 12.6 with these; through start_async + wait (as
``WhisperModel`` runs it) 16.6 against 16.1 for optimum-intel's decoder IR (OpenVINO GenAI's, its u8 cache).

Derived once into a folder (``stateful_decoder``: npurt's ``cache_dir`` keeps it), in a child process (OpenVINO's
reader and save_model hold the weights more than once on the way), and checked there before it is kept: the
stateful IR against the export compiled as it is, fed the same ids and caches (random keys and values, a reset,
three steps of one row, a first step of two rows from one, and a reordered step of two rows), the logits within
1e-4 x their largest magnitude (at least 1). A form that cannot be made or fails the check is an NpuError, and
``WhisperModel`` feeds the cache back instead, saying why (``state_refused``, in ``describe()``).

    python openvino_state.py SOURCE_ONNX TARGET_XML     (the child: exit 0, or 2 with one line on stderr)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

BEAM_IDX = "beam_idx"
SEED = "seed."  # the prefix of each variable's initial-value input: seed.past_key_values.{i}.decoder.{key,value}
LOGITS = "logits"
# the CPU plug-in's settings the form is checked with and run at: its attention keeps the cache at f32 (its default
# compresses a stateful attention's cache to u8: logits 8e-3 from the export's, measured)
ENGINE_OPTIONS = {"KV_CACHE_PRECISION": "f32"}
FILE = "decoder_with_past_stateful.xml"
_VERSION = 1  # of the derivation: a change here makes new cache entries
_PAST = re.compile(r"^past_key_values\.(\d+)\.decoder\.(key|value)$")
_TOLERANCE = 1e-4


def folder_for(with_past: Path, cache_dir: Path, form: tuple[object, ...] = (_VERSION,)) -> Path:
    """The folder of ``cache_dir`` that keeps a form derived from this export, keyed by its path, size and time and
    by ``form`` (what tells the form apart: by default this module's stateful one, at its version;
    ``static_cache.folder_for`` gives its own)."""
    stat = with_past.stat()
    key = hashlib.sha256(json.dumps([str(with_past.resolve()), stat.st_size, stat.st_mtime_ns, *form]).encode())
    return cache_dir / "speech" / key.hexdigest()[:32]


def stateful_decoder(with_past: Path, folder: Path) -> Path:
    """The stateful IR of ``with_past`` in ``folder``, derived and checked where it is not there yet. NpuError
    (the child's reason) where OpenVINO cannot make it or it fails the check."""
    from ..types import NpuError

    path = folder / FILE
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f"{path.stem}.{os.getpid()}.partial.xml")  # (other processes may write theirs)
    done = subprocess.run([sys.executable, str(Path(__file__)), str(with_past), str(draft)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        draft.unlink(missing_ok=True)
        draft.with_suffix(".bin").unlink(missing_ok=True)
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
        raise NpuError(f"{with_past.name}: OpenVINO cannot keep its self-attention cache as state: {last}")
    draft.with_suffix(".bin").replace(path.with_suffix(".bin"))
    draft.replace(path)
    return path


# -- the child: OpenVINO imported here only ------------------------------------------------------------------------


def _make(source: str) -> Any:
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops
    from openvino.op.util import Variable, VariableInfo
    from openvino.opset6 import read_value

    model = ov.Core().read_model(source)
    beam = ops.parameter([-1], ov.Type.i32, name=BEAM_IDX)
    beam.output(0).get_tensor().set_names({BEAM_IDX})
    added = [beam]
    sinks = []
    for param in list(model.get_parameters()):
        name = param.output(0).get_any_name()
        found = _PAST.match(name)
        if not found:
            continue
        present = model.output(f"present.{found.group(1)}.decoder.{found.group(2)}").get_node()
        seed = ops.parameter(param.get_partial_shape(), param.get_element_type(), name=SEED + name)
        seed.output(0).get_tensor().set_names({SEED + name})
        info = VariableInfo()
        info.variable_id = name
        info.data_type = param.get_element_type()
        info.data_shape = param.get_partial_shape()
        variable = Variable(info)
        read = read_value(seed, variable)
        gathered = ops.gather(read, beam, ops.constant(np.int64(0)))
        for consumer in list(param.output(0).get_target_inputs()):
            consumer.replace_source_output(gathered.output(0))
        grown = present.input_value(0)
        if grown.get_node().get_output_size() != 1:  # (Assign takes a node: one of a single output)
            grown = ops.convert(grown, param.get_element_type()).output(0)
        sinks.append(ov.op.assign(grown.get_node(), variable))
        model.remove_result(present)
        model.remove_parameter(param)
        model.add_variables([variable])
        added.append(seed)
    if len(added) == 1:
        raise ValueError("no past_key_values.{i}.decoder.{key,value} inputs (optimum's decoder_with_past_model.onnx "
                         "expected)")
    if [o.get_any_name() for o in model.outputs] != [LOGITS]:
        raise ValueError(f"outputs {[o.get_any_name() for o in model.outputs]} left, not logits alone")
    model.add_parameters(added)
    model.add_sinks(sinks)
    _attention_as_sdpa(model)
    _tied_logits(model)
    model.validate_nodes_and_infer_types()
    return model


def _scalar(node: Any) -> float | None:
    if node.get_type_name() != "Constant":
        return None
    data = node.get_data()
    return float(data.reshape(-1)[0]) if data.size == 1 else None


def _attention_as_sdpa(model: Any) -> int:
    """Each attention as the export writes it, ``Softmax(MatMul(Transpose(q) * a, Transpose(k, [0, 1, 3, 2]) * b)
    [+ mask]) @ v`` (the scale split in two; transformers' ``where(isnan(p), 0, p)`` after the softmax where there
    is a mask), replaced by one ScaledDotProductAttention(q, k, v, mask, a * b): the CPU plug-in then reads the
    cross-attention keys as they are (not transposed and scaled every step) and keeps the self-attention cache in
    place (its stateful attention: the variable, the beam_idx Gather and the Concat fused). No row of these masks is
    all masked (a query sees at least itself), so the isnan guard has nothing to guard. An attention of another
    shape is left as it is. Returns how many were replaced."""
    import numpy as np
    from openvino import opset13 as ops

    replaced = 0
    for softmax in [op for op in model.get_ordered_ops() if op.get_type_name() == "Softmax"]:
        source = softmax.input_value(0).get_node()
        mask = source.input_value(1) if source.get_type_name() == "Add" else None
        scores = source.input_value(0).get_node() if mask is not None else source
        if scores.get_type_name() != "MatMul" or any(scores.get_attributes().values()):
            continue
        scaled_q, scaled_k = scores.input_value(0).get_node(), scores.input_value(1).get_node()
        if scaled_q.get_type_name() != "Multiply" or scaled_k.get_type_name() != "Multiply":
            continue
        a, b = _scalar(scaled_q.input_value(1).get_node()), _scalar(scaled_k.input_value(1).get_node())
        k_transposed = scaled_k.input_value(0).get_node()
        if a is None or b is None or k_transposed.get_type_name() != "Transpose" or \
                k_transposed.input_value(1).get_node().get_type_name() != "Constant" or \
                list(k_transposed.input_value(1).get_node().get_data()) != [0, 1, 3, 2]:
            continue
        users = [t.get_node() for t in softmax.output(0).get_target_inputs()]
        guards = [n for n in users if n.get_type_name() == "Select"]
        if guards:  # where(isnan(p), 0, p): its Select's users take the probabilities
            if mask is None or len(guards) != 1 or {n.get_type_name() for n in users} != {"Select", "IsNaN"}:
                continue
            users = [t.get_node() for t in guards[0].output(0).get_target_inputs()]
        if len(users) != 1 or users[0].get_type_name() != "MatMul" or any(users[0].get_attributes().values()):
            continue
        weighted = users[0]
        q, k, v = scaled_q.input_value(0), k_transposed.input_value(0), weighted.input_value(1)
        scale = ops.constant(np.array(a * b, np.float32))
        attended = ops.scaled_dot_product_attention(q, k, v, mask if mask is not None else
                                                    ops.constant(np.array(0.0, np.float32)), scale, causal=False)
        for consumer in list(weighted.output(0).get_target_inputs()):
            consumer.replace_source_output(attended.output(0))
        replaced += 1
    return replaced


def _tied_logits(model: Any) -> bool:
    """The logits' MatMul over the token embedding's own table (transpose_b) where its weights are that table
    transposed (Whisper ties them): one copy of the vocabulary's weights in the IR and in memory, not two."""
    from openvino import opset13 as ops

    weighted = model.output(LOGITS).get_node().input_value(0).get_node()
    if weighted.get_type_name() != "MatMul" or any(weighted.get_attributes().values()):
        return False
    weights = weighted.input_value(1).get_node()
    if weights.get_type_name() != "Constant" or len(weights.get_output_shape(0)) != 2:
        return False
    data = weights.get_data()
    for gather in (op for op in model.get_ordered_ops() if op.get_type_name() == "Gather"):
        table = gather.input_value(0).get_node()
        if table.get_type_name() == "Constant" and tuple(table.get_output_shape(0)) == data.T.shape and \
                (table.get_data() == data.T).all():
            tied = ops.matmul(weighted.input_value(0), table.output(0), False, True)
            tied.output(0).get_tensor().set_names(weighted.output(0).get_names())
            for consumer in list(weighted.output(0).get_target_inputs()):
                consumer.replace_source_output(tied.output(0))
            return True
    return False


def _check(source: str, target: str) -> float:
    """The largest difference between the stateful IR's logits and the export's over the checked steps (see the
    module), relative to the export's largest magnitude; ValueError past the tolerance."""
    import numpy as np
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", **ENGINE_OPTIONS}
    plain = core.compile_model(core.read_model(source), "CPU", config).create_infer_request()
    compiled = core.compile_model(core.read_model(target), "CPU", config)
    stateful = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    pasts = [p for p in plain.model_inputs if _PAST.match(p.get_any_name())]
    cross = [p for p in plain.model_inputs if ".encoder." in p.get_any_name()]
    heads, head_dim = (int(pasts[0].get_partial_shape()[1].get_length()),
                       int(pasts[0].get_partial_shape()[3].get_length()))
    frames = 50 if cross[0].get_partial_shape()[2].is_dynamic else cross[0].get_partial_shape()[2].get_length()
    vocab = int(plain.model_outputs[0].get_partial_shape()[-1].get_length())
    cross_kv = {p.get_any_name(): rng.standard_normal((1, heads, frames, head_dim), np.float32) for p in cross}
    seeds = {p.get_any_name(): rng.standard_normal((1, heads, 2, head_dim), np.float32) for p in pasts}
    names = {p.get_any_name(): f"present.{p.get_any_name().split('.', 1)[1]}" for p in pasts}
    # (rows' ids, each row's source row in the state): one row three times, two rows from one, two rows reordered
    steps = [([11], [0]), ([220], [0]), ([1000], [0]), ([5, 6], [0, 0]), ([7, 8], [1, 0])]
    worst = _steps(plain, stateful, names, steps, seeds, cross_kv, vocab)
    # a new request whose first run has two rows from initial values of two rows (what WhisperModel feeds where rows
    # are chosen before the first step), then one reordered
    seeds = {k: np.ascontiguousarray(np.repeat(v, 2, axis=0)) for k, v in seeds.items()}
    again = _steps(plain, compiled.create_infer_request(), names, [([3, 4], [0, 1]), ([9, 10], [1, 1])], seeds,
                   cross_kv, vocab)
    return max(worst, again)


def _steps(plain: Any, stateful: Any, names: dict[str, str], steps: list[tuple[list[int], list[int]]],
           seeds: dict[str, Any], cross_kv: dict[str, Any], vocab: int) -> float:
    """``steps`` from a reset on both forms (the export fed its cache, starting from ``seeds``); the largest
    relative difference of their logits, ValueError past the tolerance."""
    import numpy as np

    cache = dict(seeds)
    worst = 0.0
    stateful.reset_state()
    for ids, order in steps:
        tokens = np.array([[i % vocab] for i in ids], np.int64)
        rows = np.array(order, np.int64)
        cache = {k: np.ascontiguousarray(v[rows]) for k, v in cache.items()}
        wide = {k: np.ascontiguousarray(np.repeat(v, len(ids), axis=0)) for k, v in cross_kv.items()}
        want = plain.infer({"input_ids": tokens, **cache, **wide})
        got = stateful.infer({"input_ids": tokens, BEAM_IDX: np.array(order, np.int32), **cross_kv,
                              **{SEED + k: v for k, v in seeds.items()}})
        expected = np.asarray(want[plain.model_outputs[0]])
        diff = float(np.max(np.abs(np.asarray(got[LOGITS]) - expected))) / max(1.0, float(np.max(np.abs(expected))))
        worst = max(worst, diff)
        if diff > _TOLERANCE:
            raise ValueError(f"the stateful form's logits are {diff:.3g} from the export's (tolerance {_TOLERANCE}) "
                             f"at rows {order}")
        cache = {k: np.asarray(want[names[k]]) for k in cache}
    return worst


def main(argv: list[str]) -> int:
    source, target = argv
    try:
        import openvino as ov

        model = _make(source)
        ov.save_model(model, target, compress_to_fp16=False)
        _check(source, target)
    except Exception as e:  # noqa: BLE001 - any failure is the one line the parent reports
        Path(target).unlink(missing_ok=True)
        Path(target).with_suffix(".bin").unlink(missing_ok=True)
        print(" ".join(str(e).split())[:500] or type(e).__name__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
