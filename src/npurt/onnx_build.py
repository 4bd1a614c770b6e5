"""The one graph builder: nodes and constants added to an ONNX graph under names of their own.

Every graph npurt derives from a model (HW views at the ports, frames' preprocessing, a decoder's static-shape form)
is the model's graph with nodes added in front of it or behind it. A builder makes those nodes and their constant
inputs, each named under one prefix (a port's or a frame's name with npurt's suffix) and numbered, so nothing it adds
can clash with a name of the model or of another builder. The caller decides where the nodes go (``nodes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import onnx_proto

if TYPE_CHECKING:
    import onnx

Step = tuple[str, dict[str, Any], list[str]]  # one node of a chain: op, attributes, the inputs after the running one


class GraphBuilder:
    """Adds constants to ``graph`` at once (as initializers) and collects the nodes it makes in ``nodes``."""

    def __init__(self, graph: onnx.GraphProto, prefix: str) -> None:
        self.graph = graph
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def _name(self, what: str) -> str:
        self._count += 1
        return f"{self.prefix}_{what}_{self._count}"

    def const(self, values: np.ndarray | Sequence[int]) -> str:
        """An initializer holding ``values`` (a sequence of ints is int64, as shapes and indices are)."""
        array = values if isinstance(values, np.ndarray) else np.asarray(values, np.int64)
        name = self._name("const")
        self.graph.initializer.append(onnx_proto.from_array(array, name))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str | None = None, *, domain: str = "",
             **attrs: Any) -> str:
        """A node of ``op`` over ``inputs``; its output is ``output`` where given, else a new name, returned."""
        name = self._name(op)
        out = output if output is not None else name
        self.nodes.append(onnx_proto.make_node(op, list(inputs), [out], name=name, domain=domain or None, **attrs))
        return out

    def chain(self, src: str, dst: str, steps: Sequence[Step]) -> None:
        """``steps`` applied one after another to ``src``, the last one writing ``dst``."""
        cur = src
        for k, (op, attrs, extra) in enumerate(steps):
            cur = self.node(op, [cur, *extra], dst if k == len(steps) - 1 else None, **attrs)
