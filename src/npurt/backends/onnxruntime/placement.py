"""Placement per node on ONNX Runtime: which EP each node of a session went to, and why a node left the EP.

The source is the session's own graph assignment (option ``session.record_ep_graph_assignment_info``): the nodes of
the optimized graph, each with the EP that runs it. Their names are mapped back to the model's: a node that kept its
name keeps it; ONNX Runtime names an unnamed node ``<op_type>@<k>`` (the k-th unnamed node of that type, in graph
order), which is mapped to the model's node and named by its first output; a node ONNX Runtime made (a fusion) keeps
ONNX Runtime's name. Reasons come from the EP where it says why it refused a node (``reasons``), else from what
npurt knows (no EP asked for, or the EP took nothing).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...types import NodePlacement

_UNNAMED = re.compile(r"^(?P<op>.+)@(?P<k>\d+)$")
ModelNodes = list[tuple[str, str, str]]  # the model's main-graph nodes: (name, op_type, first output)


@dataclass
class Placement:
    """The nodes of one session as ONNX Runtime assigned them: (name, op_type, EP), in its order."""

    assigned: tuple[tuple[str, str, str], ...] = ()
    asked: str = ""  # the EP the runner asked for (CPUExecutionProvider where it asked for none)
    reasons: Mapping[str, str] = field(default_factory=dict)  # node (ONNX Runtime's name) -> why the EP refused it
    why_not_asked: str = ""  # why no node is on the device asked for (a fallback), for every node

    @classmethod
    def of_session(cls, session: Any, asked: str) -> Placement:
        assigned = tuple((n.name, n.op_type, sg.ep_name) for sg in session.get_provider_graph_assignment_info()
                         for n in sg.get_nodes())
        return cls(assigned, asked)

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
        """One NodePlacement per node, named as the model names it (``model_nodes`` is read only where an unnamed
        node must be mapped back)."""
        names: dict[str, str] | None = None
        result = []
        for engine_name, op_type, ep in self.assigned:
            name = engine_name
            match = _UNNAMED.match(name)
            if match is not None and match["op"] == op_type:
                if names is None:
                    names = _unnamed_node_names(model_nodes())
                name = names.get(name, name)
            reason = None
            if ep != self.asked:
                reason = (self.reasons.get(engine_name) or self.why_not_asked
                          or f"ONNX Runtime assigned it to {ep}: {self.asked} did not claim it (it gave no reason)")
            result.append(NodePlacement(name, op_type, ep, reason))
        return tuple(result)


def _unnamed_node_names(model_nodes: ModelNodes) -> dict[str, str]:
    """ONNX Runtime's ``<op_type>@<k>`` -> the first output of the model's k-th unnamed node of that type."""
    seen: Counter[str] = Counter()
    names = {}
    for name, op_type, first_output in model_nodes:
        if name:
            continue
        names[f"{op_type}@{seen[op_type]}"] = first_output or f"{op_type}@{seen[op_type]}"
        seen[op_type] += 1
    return names
