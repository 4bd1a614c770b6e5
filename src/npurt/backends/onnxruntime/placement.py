"""Placement per node on ONNX Runtime: which EP each node of a session went to, and why a node left the EP.

The source is the session's own graph assignment (option ``session.record_ep_graph_assignment_info``): the nodes of
the optimized graph, each with the EP that runs it, by name. A node that kept its name keeps it; a node ONNX Runtime
made (a fusion) has ONNX Runtime's name; an unnamed node of the model is named by its first output (see
``Placement._names_of_unnamed``). Reasons come from the EP where it says why it refused a node (``reasons``), else
from what npurt knows (no EP asked for, or the EP took nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...types import NodePlacement

ModelNodes = list[tuple[str, str, str]]  # the model's main-graph nodes: (name, op_type, first output)


@dataclass
class Placement:
    """The nodes of one session as ONNX Runtime assigned them: (name, op_type, EP), in its order."""

    given: tuple[tuple[str, str, str], ...] = ()  # as given; else read from ``session`` when first asked for
    asked: str = ""  # the EP the runner asked for (CPUExecutionProvider where it asked for none)
    reasons: Mapping[str, str] = field(default_factory=dict)  # node (ONNX Runtime's name) -> why the EP refused it
    why_not_asked: str = ""  # why no node is on the device asked for (a fallback), for every node
    session: Any = None

    @classmethod
    def of_session(cls, session: Any, asked: str) -> Placement:
        """Read when first asked for: a node's name, type and EP are three calls into ONNX Runtime each (0.5 ms
        for PP-OCR's classifier, a fifth of npurt's share of a cached load)."""
        return cls(asked=asked, session=session)

    @property
    def assigned(self) -> tuple[tuple[str, str, str], ...]:
        if self.session is not None:
            self.given = tuple((n.name, n.op_type, sg.ep_name)
                               for sg in self.session.get_provider_graph_assignment_info() for n in sg.get_nodes())
            self.session = None
        return self.given

    @property
    def nodes(self) -> tuple[tuple[str, str, str], ...]:
        return self.assigned

    def counts(self) -> Counter[str]:
        return Counter(ep for _, _, ep in self.assigned)

    def summary(self) -> tuple[tuple[str, int], ...]:
        """(EP, node count), the EP asked for first: DeviceInfo.placement."""
        counts = self.counts()
        return tuple(sorted(counts.items(), key=lambda kv: (kv[0] != self.asked, kv[0])))

    def per_node(self, model_nodes: Callable[[], ModelNodes]) -> tuple[NodePlacement, ...]:
        """One NodePlacement per node, named as the model names it (``model_nodes`` is read only where a node has no
        name)."""
        names = self._names_of_unnamed(model_nodes) if any(not n for n, _, _ in self.assigned) else {}
        result = []
        for k, (engine_name, op_type, ep) in enumerate(self.assigned):
            reason = None
            if ep != self.asked:
                reason = (self.reasons.get(engine_name) or self.why_not_asked
                          or f"ONNX Runtime assigned it to {ep}: {self.asked} did not claim it (it gave no reason)")
            result.append(NodePlacement(engine_name or names.get(k, f"(unnamed {op_type})"), op_type, ep, reason))
        return tuple(result)

    def _names_of_unnamed(self, model_nodes: Callable[[], ModelNodes]) -> dict[int, str]:
        """Unnamed nodes by their first output: ONNX Runtime gives them no name (and no outputs), so the k-th unnamed
        node of an operator type in its list is the model's k-th one, where both count the same unnamed nodes of
        that type (ONNX Runtime keeps the model's order; a fusion that removed or made one would shift them, and then
        they stay unnamed rather than misnamed)."""
        model: dict[str, list[str]] = {}
        for name, op_type, first_output in model_nodes():
            if not name:
                model.setdefault(op_type, []).append(first_output)
        engine: dict[str, list[int]] = {}
        for k, (name, op_type, _) in enumerate(self.assigned):
            if not name:
                engine.setdefault(op_type, []).append(k)
        names: dict[int, str] = {}
        for op_type, positions in engine.items():
            outputs = model.get(op_type, [])
            if len(outputs) == len(positions):
                names.update(zip(positions, outputs))
        return names
