"""Ports: a model's inputs and outputs as an engine reads them, and both views of each as a runner offers them.

- ``PortSpec``: one input or output as read from the model (dynamic dims are None), with its QDQ boundary.
- ``Port``: one port of a compiled engine: its CPU view (the model's own layout and dtype), its HW view (what the
  device consumes) and which of the two the engine takes.
- ``PortFactory``: the runner's rules for turning a spec into a port: the view each port takes (options
  ``input_tensor_type`` / ``output_tensor_type``, per tensor too) and whose HW view applies (option ``hw_view``:
  the attached device's, or the NPU's wherever the runner runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import formats
from .modelfile import PORT_KINDS, OnnxModelInfo, OnnxPort, read_onnx_ports
from .options import RunnerOptions
from .types import (
    DYNAMIC_DIM,
    DataType,
    MemoryLayout,
    NpuTensorInfo,
    NpuUnsupportedError,
    QuantParameters,
    TensorDirection,
    TensorType,
)

Signature = tuple[tuple[int, ...], ...]  # the input shapes (CPU view) of one run, in port order

# ONNX element types (TensorProto.DataType numbers) that npurt carries; numpy has no dtype for the others.
ONNX_DATA_TYPES = {
    1: DataType.FLOAT32, 2: DataType.UINT8, 3: DataType.INT8, 4: DataType.UINT16, 5: DataType.INT16,
    6: DataType.INT32, 7: DataType.INT64, 9: DataType.BOOLEAN, 10: DataType.FP16, 11: DataType.FLOAT64,
    12: DataType.UINT32, 13: DataType.UINT64, 16: DataType.BF16,
}
DATA_TYPES_ONNX = {d: t for t, d in ONNX_DATA_TYPES.items()}


@dataclass(frozen=True)
class PortSpec:
    """A model input or output as the engine reads it: dynamic dims are None."""

    name: str
    data_type: DataType
    shape: tuple[int | None, ...]
    quant: QuantParameters | None = None  # set where the NPU's view is the quantized tensor (QDQ boundary)
    quant_data_type: DataType | None = None  # INT8 / UINT8 / UINT16: the quantized tensor's type, with quant
    dim_names: tuple[str | None, ...] = ()
    layout: MemoryLayout | None = None  # None: the model's own for its rank (NCHW for 4-D); NHWC for a frame port

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    def dynamic_dims(self) -> list[str]:
        names = self.dim_names or (None,) * len(self.shape)
        return [f"dim {i}" + (f" ({n})" if n else "") for i, (d, n) in enumerate(zip(self.shape, names)) if d is None]

    def shape_text(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    def fits(self, shape: Sequence[int]) -> bool:
        """Whether a concrete shape is one this port takes (rank and fixed dims)."""
        return len(shape) == len(self.shape) and all(d is None or d == g for d, g in zip(self.shape, shape))

    def with_shape(self, shape: Sequence[int | None]) -> PortSpec:
        return PortSpec(self.name, self.data_type, tuple(shape), self.quant, self.quant_data_type, self.dim_names,
                        self.layout)


@dataclass(frozen=True)
class Port:
    """One port of a compiled engine: both views of its tensor, and the one the engine consumes."""

    cpu: NpuTensorInfo
    hw: NpuTensorInfo
    view: TensorType
    quant: QuantParameters | None = None  # where the HW view is the quantized tensor

    @property
    def name(self) -> str:
        return self.cpu.name

    def info(self, tensor_type: TensorType) -> NpuTensorInfo:
        return self.hw if tensor_type is TensorType.HW else self.cpu

    @property
    def engine(self) -> NpuTensorInfo:
        """The view the engine consumes."""
        return self.info(self.view)

    @property
    def converts(self) -> bool:
        """Whether the engine's view differs from the model's: a conversion is built into the compiled model."""
        return self.view is TensorType.HW and self.hw != self.cpu.replace(tensor_type=TensorType.HW)

    @property
    def is_static(self) -> bool:
        return self.cpu.is_static


def spec_of_onnx_port(port: OnnxPort, what: str) -> PortSpec:
    """A model port as the ONNX file declares it; NpuUnsupportedError naming it where npurt cannot carry it."""
    if port.kind != "tensor":
        raise NpuUnsupportedError(f"{what} {port.name!r} is a {port.kind}; npurt carries tensors (sequences, maps "
                                  "and optionals are out of its scope)")
    dtype = ONNX_DATA_TYPES.get(port.elem_type)
    if dtype is None:
        raise NpuUnsupportedError(f"{what} {port.name!r} has element type {port.elem_type_name}, which npurt does "
                                  "not carry (numpy has no such dtype, or it is a string tensor)")
    if port.shape is None:
        raise NpuUnsupportedError(f"{what} {port.name!r} has no shape (unknown rank) in the model")
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in port.shape)
    names = tuple(d if isinstance(d, str) and d else None for d in port.shape)
    return PortSpec(port.name, dtype, shape, dim_names=names)


Remember = Callable[[Callable[[], Any], Callable[[Any], Any]], Any]  # (compute, decode) -> the value decoded


def onnx_port_specs(path: str | os.PathLike[str], remember: Remember | None = None
                    ) -> tuple[list[PortSpec], list[PortSpec]]:
    """An ONNX model's own inputs and outputs, read from the file without loading it (its nodes are not walked).
    ``remember``: where they may be kept between processes as JSON (the compiled-model cache's index, per file
    identity), read from the file only where it holds none. ValueError where the file is not an ONNX model;
    NpuUnsupportedError naming a port npurt cannot carry."""
    if remember is None:
        info = read_onnx_ports(path, nodes=False)
        inputs, outputs = info.inputs, info.outputs
    else:
        inputs, outputs = remember(lambda: _ports_json(read_onnx_ports(path, nodes=False)), _ports_of_json)
    return ([spec_of_onnx_port(p, "input") for p in inputs],
            [spec_of_onnx_port(p, "output") for p in outputs])


def _ports_json(info: OnnxModelInfo) -> dict[str, list[list[Any]]]:
    return {side: [[p.name, p.kind, p.elem_type, None if p.shape is None else list(p.shape)] for p in ports]
            for side, ports in (("inputs", info.inputs), ("outputs", info.outputs))}


def _ports_of_json(kept: Any) -> tuple[tuple[OnnxPort, ...], tuple[OnnxPort, ...]]:
    """The ports kept by ``_ports_json``; ValueError for anything else (a damaged or foreign index)."""
    def port(item: Any) -> OnnxPort:
        name, kind, elem_type, shape = item
        if not (isinstance(name, str) and kind in PORT_KINDS and type(elem_type) is int and (shape is None or (
                isinstance(shape, list) and all(d is None or type(d) in (int, str) for d in shape)))):
            raise ValueError(f"not a port: {item!r}")
        return OnnxPort(name, kind, elem_type, None if shape is None else tuple(shape))

    if not isinstance(kept, dict) or not isinstance(kept.get("inputs"), list) or \
            not isinstance(kept.get("outputs"), list):
        raise ValueError("not the ports of a model")
    return tuple(port(p) for p in kept["inputs"]), tuple(port(p) for p in kept["outputs"])


class PortFactory:
    """Turns specs into ports by the runner's options: which view each port takes, and whose HW view applies."""

    def __init__(self, options: RunnerOptions, target: str, attached: str) -> None:
        self.options = options
        # The HW view is what the attached device consumes: the NPU's view on the NPU (or everywhere with
        # hw_view="npu"); on CPU and GPU the model's own view, so that nothing is converted in the graph.
        self.npu_views = options.hw_view == "npu" or attached == "NPU"
        self.target = target if self.npu_views else ""

    def make(self, spec: PortSpec, direction: TensorDirection) -> Port:
        """Both views of a port (dynamic dims as DYNAMIC_DIM), in the view the options chose for it."""
        shape = tuple(DYNAMIC_DIM if d is None else int(d) for d in spec.shape)
        # (a spec's parts are checked where it is made: its dims are None or ints >= 0, its type a member)
        cpu = NpuTensorInfo.of_port(spec.name, spec.data_type, shape, direction,
                                    spec.layout or formats.default_layout(len(shape)))
        override = self.options.hw_format.get(spec.name)
        # a QDQ boundary's HW view is the quantized tensor, unless hw_format asks for another data type (then the
        # boundary stays in the model and the view is converted like any other)
        quantized = spec.quant is not None and self.npu_views and \
            (override is None or override.data_type in (None, spec.quant_data_type))
        hw = formats.hw_view(cpu, self.target, quant_data_type=spec.quant_data_type if quantized else None,
                             override=override)
        return Port(cpu=cpu, hw=hw, view=self.options.tensor_type(direction, spec.name),
                    quant=spec.quant if quantized else None)

    def make_all(self, specs: Sequence[PortSpec], direction: TensorDirection) -> list[Port]:
        return [self.make(s, direction) for s in specs]


def check_port_options(options: RunnerOptions, ins: Sequence[PortSpec], outs: Sequence[PortSpec]) -> dict[str, str]:
    """Options that name ports must name the model's: per-tensor views, hw_format, state_pairs (whose input and
    output must also be alike). ValueError otherwise; the state pairs, checked."""
    names = {TensorDirection.INPUT: {s.name for s in ins}, TensorDirection.OUTPUT: {s.name for s in outs}}
    for direction, name in options.tensor_types:
        if name not in names[direction]:
            raise ValueError(f"option '{direction.name.lower()}_tensor_type.{name}': the model has no "
                             f"{direction.name.lower()} {name!r} (it has {sorted(names[direction])})")
    all_names = names[TensorDirection.INPUT] | names[TensorDirection.OUTPUT]
    for name in options.hw_format:
        if name not in all_names:
            raise ValueError(f"option 'hw_format': the model has no tensor {name!r} (it has {sorted(all_names)})")
    pairs = dict(options.state_pairs)
    by_in, by_out = {s.name: s for s in ins}, {s.name: s for s in outs}
    for i, o in pairs.items():
        if i not in by_in or o not in by_out:
            raise ValueError(f"option 'state_pairs': {i!r} <- {o!r}: the model has inputs {sorted(by_in)} and "
                             f"outputs {sorted(by_out)}")
        if by_in[i].data_type is not by_out[o].data_type or len(by_in[i].shape) != len(by_out[o].shape):
            raise ValueError(f"option 'state_pairs': input {i!r} ({by_in[i].data_type.name} {by_in[i].shape_text()}) "
                             f"cannot take output {o!r} ({by_out[o].data_type.name} {by_out[o].shape_text()})")
    return pairs
