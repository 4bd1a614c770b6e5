"""What a decoder export is made of, read from its graph alone (a model without its weights will do): the ports
npurt's static form keeps or adds, and the cache tensors (past / present pairs) at ``max_length`` rows. The static
form (``static_form``) is built from it; the runner and the Generator only need this, and so never import onnx.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..onnx_graph import graph_inputs

if TYPE_CHECKING:
    import onnx

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
POSITION = "position"
LOGITS = "logits"
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


def read(model: onnx.ModelProto, max_length: int) -> Layout:
    """The export's layout (see Layout), checked; raises ValueError naming what does not fit it (no past / present,
    names that do not pair, a missing input, a max_length below 1)."""
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
    pairs = []
    for name, value in inputs.items():
        match = _PAST.match(name)
        if match is None:
            continue
        present = f"present.{match.group(1)}.{match.group(2)}"
        if present not in outputs:
            raise ValueError(f"past input {name!r} has no present output {present!r} to pair with")
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 4 or not (dims[1].HasField("dim_value") and dims[3].HasField("dim_value")):
            raise ValueError(f"past input {name!r} is not [batch, kv_heads, past, head_dim] with kv_heads and "
                             "head_dim fixed")
        pairs.append(CachePair(name, present, (1, dims[1].dim_value, max_length, dims[3].dim_value),
                               value.type.tensor_type.elem_type))
    if not pairs:
        raise ValueError("not a decoder with a KV cache: no past_key_values.{i}.key / .value inputs")
    orphans = sorted(o for o in outputs if o.startswith("present.") and o not in {p.present for p in pairs})
    if orphans:
        raise ValueError(f"present output {orphans[0]!r} has no past_key_values input to pair with")
    known = {INPUT_IDS, ATTENTION_MASK, POSITION_IDS} | {p.past for p in pairs}
    extra = sorted(set(inputs) - known)
    if extra:
        raise ValueError(f"decoder input {extra[0]!r} is not one npurt can feed (known: input_ids, attention_mask, "
                         "position_ids, past_key_values.{i}.key/value)")
    return Layout(max_length, tuple(sorted(pairs, key=lambda p: _order(p.past))), POSITION_IDS in inputs,
                  _vocab(model.graph))


def _order(name: str) -> tuple[int, str]:
    match = _PAST.match(name)
    assert match is not None
    return int(match.group(1)), match.group(2)


def _vocab(graph: onnx.GraphProto) -> int | None:
    logits = next(v for v in graph.output if v.name == LOGITS)
    dims = logits.type.tensor_type.shape.dim
    return int(dims[-1].dim_value) if dims and dims[-1].HasField("dim_value") else None
