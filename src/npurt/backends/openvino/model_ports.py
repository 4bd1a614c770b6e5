"""How the model's own ports map onto the model OpenVINO made of it (and onto what it compiled)."""

from __future__ import annotations

from collections.abc import Sequence

import openvino as ov

from ...ports import PortSpec
from ...types import NpuError


def partial_shape(shape: Sequence[int]) -> ov.PartialShape:
    return ov.PartialShape([int(d) for d in shape])  # -1 (DYNAMIC_DIM) is OpenVINO's dynamic dim too


def spec_shape(pshape: ov.PartialShape) -> tuple[int | None, ...]:
    return tuple(d.get_length() if d.is_static else None for d in pshape)


class ModelPorts:
    """How the model's own ports (ONNX order) map onto OpenVINO's model.

    OpenVINO's ONNX frontend may keep an input under another name (Dropout's input takes its output's name) and
    folds an output that is an input passed through (a Sum or Max of one input, Dropout at inference) into that
    input: the compiled model never writes such an output, so the engine copies the input into it (counted).
    """

    def __init__(self, param_of: list[int | None], result_of: list[int], alias_of: list[int | None]) -> None:
        self.param_of = param_of  # model input i -> index of OpenVINO's parameter (None: OpenVINO dropped it)
        self.result_of = result_of  # model output j -> index of OpenVINO's result
        self.alias_of = alias_of  # model output j -> the model input it passes through, where it does

    @classmethod
    def of(cls, model: ov.Model, ins: Sequence[PortSpec], outs: Sequence[PortSpec]) -> ModelPorts:
        params = list(model.inputs)
        param_of: list[int | None] = [None] * len(ins)
        taken: set[int] = set()
        for i, spec in enumerate(ins):
            k = next((k for k, p in enumerate(params) if k not in taken and spec.name in p.get_names()), None)
            if k is not None:
                param_of[i] = k
                taken.add(k)
        # what is left pairs up in order: OpenVINO keeps the order of the inputs it keeps
        left = [k for k in range(len(params)) if k not in taken]
        for i, k in zip([i for i, k in enumerate(param_of) if k is None], left):
            param_of[i] = k
        input_of_param = {k: i for i, k in enumerate(param_of) if k is not None}
        results = list(model.outputs)
        result_of, alias_of = [], []
        for spec in outs:
            k = next((k for k, r in enumerate(results)
                      if r.get_node().get_friendly_name().removesuffix("/sink_port_0") == spec.name), None)
            if k is None:
                k = next((k for k, r in enumerate(results) if spec.name in r.get_names()), None)
            if k is None:
                raise NpuError(f"output {spec.name!r}: OpenVINO's model has no such output (its outputs: "
                               f"{[sorted(r.get_names()) for r in results]})")
            result_of.append(k)
            source = results[k].get_node().input_value(0).get_node()
            alias = None
            if source.get_type_name() == "Parameter":
                param = next((n for n, p in enumerate(params) if p.get_node() is source or
                              p.get_node().get_friendly_name() == source.get_friendly_name()), None)
                alias = input_of_param.get(param) if param is not None else None
            alias_of.append(alias)
        return cls(param_of, result_of, alias_of)

    def compiled(self, compiled_model: ov.CompiledModel) -> ModelPorts:
        """The map for a compiled model: compiling may fold more outputs into inputs (an Einsum "->" of a scalar,
        an Identity chain); such an output shares a tensor name with the input it passes through."""
        ins, outs = list(compiled_model.inputs), list(compiled_model.outputs)
        alias_of = list(self.alias_of)
        for j, k in enumerate(self.result_of):
            if alias_of[j] is not None:
                continue
            names = outs[k].get_names()
            alias_of[j] = next((i for i, p in enumerate(self.param_of)
                                if p is not None and names & ins[p].get_names()), None)
        return ModelPorts(self.param_of, self.result_of, alias_of)
