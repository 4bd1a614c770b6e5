"""optimum's merged decoder (``decoder_model_merged.onnx``): one model whose ``If`` on the bool input
``use_cache_branch`` holds the decoder without a past and the decoder with one. npurt's forms always run with a
past (the cache of max_length rows, or OpenVINO's state), so the If is resolved to its with-past branch: the
branch's nodes and initializers take the If's place, its outputs named as the If's, and the input goes.

The with-past branch is the one that reads the past inputs (optimum puts it in ``then_branch``); a merged model
where neither does, or with no single If on ``use_cache_branch``, is a ValueError naming what was found. OpenVINO
2026.4 runs the merged model's with-past branch wrongly (logits off by 12-20 at every step with a past, measured);
resolved, it runs the plain graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

USE_CACHE_BRANCH = "use_cache_branch"
_PAST_PREFIX = "past_key_values."


def resolve_cache_branch(model: onnx.ModelProto) -> None:
    """Replace, in ``model`` itself, the If on ``use_cache_branch`` by its with-past branch (see the module); a model
    without that input is left as it is."""
    graph = model.graph
    if USE_CACHE_BRANCH not in {v.name for v in graph.input}:
        return
    ifs = [n for n in graph.node if n.op_type == "If" and n.input and n.input[0] == USE_CACHE_BRANCH]
    if len(ifs) != 1:
        raise ValueError(f"a merged decoder has one If on {USE_CACHE_BRANCH!r}; this model has {len(ifs)}")
    node = ifs[0]
    pasts = {v.name for v in graph.input if v.name.startswith(_PAST_PREFIX)}
    branches = [a.g for a in node.attribute if a.name in ("then_branch", "else_branch")]
    with_past = [g for g in branches if any(name in pasts for n in g.node for name in n.input)]
    if not with_past:
        raise ValueError(f"a merged decoder without its with-past branch: neither branch of the If on "
                         f"{USE_CACHE_BRANCH!r} reads the past inputs")
    branch = with_past[0]
    if len(branch.output) != len(node.output):
        raise ValueError(f"the If on {USE_CACHE_BRANCH!r} has {len(node.output)} outputs, its with-past branch "
                         f"{len(branch.output)}")
    renamed = {out.name: node.output[k] for k, out in enumerate(branch.output)}
    inlined = []
    for inner in branch.node:
        copy = type(inner)()
        copy.CopyFrom(inner)
        copy.input[:] = [renamed.get(name, name) for name in copy.input]
        copy.output[:] = [renamed.get(name, name) for name in copy.output]
        inlined.append(copy)
    at = list(graph.node).index(node)
    nodes = [*graph.node[:at], *inlined, *graph.node[at + 1:]]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(branch.initializer)
    kept = [v for v in graph.input if v.name != USE_CACHE_BRANCH]
    del graph.input[:]
    graph.input.extend(kept)
