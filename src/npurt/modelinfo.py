"""What a model file declares, before any engine compiles it: its format and its ports.

``inspect_model(path)`` reads an ONNX file with npurt's own reader (``npurt.modelfile``: no weights are parsed) and an
OpenVINO IR ``.xml`` with OpenVINO's reader; anything else ends in ``ModelFileError`` whose message says plainly what
the file is not (missing, a directory, not an ONNX protobuf, an XML file that is no IR, an IR without its weights).

A port's dims are ints where the file fixes them and None where it leaves them open (with the ONNX dim name where it
has one). ``concrete_input_shapes`` is the one rule for picking shapes to feed a dynamic model when nobody said which:
an open leading (batch) dim becomes 1; any other open dim cannot be guessed and is reported back.

    >>> from npurt.modelinfo import inspect_model
    >>> model = inspect_model("model.onnx")
    >>> [(p.name, p.shape_text(), p.dtype) for p in model.inputs]
    [('x', '[?, 3, ?, ?]', 'float32')]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .modelfile import OnnxPort, read_onnx_ports

READS = "npurt reads ONNX (.onnx) and OpenVINO IR (.xml) models"

# ONNX element type name -> the numpy dtype name of its values (types numpy lacks keep their ONNX name)
_ONNX_DTYPES = {
    "FLOAT": "float32", "UINT8": "uint8", "INT8": "int8", "UINT16": "uint16", "INT16": "int16", "INT32": "int32",
    "INT64": "int64", "BOOL": "bool", "FLOAT16": "float16", "DOUBLE": "float64", "UINT32": "uint32",
    "UINT64": "uint64", "BFLOAT16": "bfloat16", "STRING": "string",
}


class ModelFileError(ValueError):
    """The path is not a model npurt can read; the message says what it is instead."""


@dataclass(frozen=True)
class DeclaredPort:
    """One input or output as the model file declares it: ``shape`` has None for an open dim (None: unknown rank)."""

    name: str
    dtype: str  # numpy's name for the element type ("float32"), or the file's own name where numpy has none
    shape: tuple[int | None, ...] | None
    dim_names: tuple[str | None, ...] = ()
    kind: str = "tensor"  # or "sequence", "map", "optional", "sparse_tensor" (ONNX)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    @property
    def open_dims(self) -> list[int]:
        """Indices of the dims the file leaves open."""
        return [i for i, d in enumerate(self.shape or ()) if d is None]

    def shape_text(self) -> str:
        if self.shape is None:
            return "[unknown rank]"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    def describe_open_dims(self) -> str:
        names = self.dim_names or (None,) * len(self.shape or ())
        return ", ".join(f"dim {i}" + (f" ({names[i]})" if i < len(names) and names[i] else "")
                         for i in self.open_dims)

    def fits(self, shape: Sequence[int]) -> bool:
        """Whether a concrete shape is one this port takes (rank and fixed dims)."""
        return self.shape is not None and len(shape) == len(self.shape) and all(
            d is None or d == g for d, g in zip(self.shape, shape))

    def suggested_shape_flag(self) -> str:
        """``--shape NAME=...`` with the batch dim as 1 and ``D<i>`` where a size must be chosen."""
        dims = [str(d) if d is not None else ("1" if i == 0 else f"D{i}") for i, d in enumerate(self.shape or ())]
        return f"--shape {self.name}={','.join(dims)}"


@dataclass(frozen=True)
class ModelDeclaration:
    """A model file's format and its ports, in the file's order."""

    path: Path
    format: str  # "onnx" or "openvino-ir"
    inputs: tuple[DeclaredPort, ...]
    outputs: tuple[DeclaredPort, ...]

    @property
    def is_static(self) -> bool:
        return all(p.is_static for p in self.inputs)

    def input(self, name: str) -> DeclaredPort | None:
        return next((p for p in self.inputs if p.name == name), None)


@dataclass(frozen=True)
class ShapeChoice:
    """Concrete input shapes for a run: those pinned, plus those picked (an open batch dim as 1)."""

    shapes: dict[str, tuple[int, ...]]
    picked: dict[str, tuple[int, ...]]  # the inputs whose shape was picked, not given
    unresolved: tuple[DeclaredPort, ...]  # inputs with open dims beyond the batch: someone must say the size


def inspect_model(path: str | os.PathLike[str]) -> ModelDeclaration:
    """Check that ``path`` is a model npurt can read and list its ports. ModelFileError says why it is not."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a model file")
    if not os.access(path, os.R_OK):
        raise ModelFileError(f"cannot read model file {path}: permission denied")
    if path.suffix.lower() == ".xml":
        return _inspect_openvino_ir(path)
    try:
        info = read_onnx_ports(path)
    except ValueError as e:
        detail = str(e).removeprefix(f"{path} is not an ONNX model: ").removeprefix(f"{path} ")
        raise ModelFileError(f"{path} is not a model: not an ONNX file ({detail}); {READS}") from None
    except OSError as e:
        raise ModelFileError(f"cannot read model file {path}: {e.strerror or e}") from None
    if not info.ir_version or not info.node_count:
        raise ModelFileError(f"{path} is not a model: it parses as an ONNX protobuf without "
                             f"{'an IR version' if not info.ir_version else 'nodes'}; {READS}")
    return ModelDeclaration(path, "onnx", tuple(_onnx_port(p) for p in info.inputs),
                            tuple(_onnx_port(p) for p in info.outputs))


def _onnx_port(port: OnnxPort) -> DeclaredPort:
    dtype = _ONNX_DTYPES.get(port.elem_type_name, port.elem_type_name.lower())
    if port.shape is None:
        return DeclaredPort(port.name, dtype, None, (), port.kind)
    # ONNX: an int >= 0 is a fixed size (0 included), a str a named open dim, None an unnamed open dim; exporters
    # also write -1 for an open dim, and "?" as a name that names nothing
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in port.shape)
    names = tuple(d if isinstance(d, str) and d != "?" else None for d in port.shape)
    return DeclaredPort(port.name, dtype, shape, names, port.kind)


def _inspect_openvino_ir(path: Path) -> ModelDeclaration:
    import xml.etree.ElementTree as ET

    # Checked first: on a file that is no IR, OpenVINO tries every frontend and some of them print to stderr.
    try:
        root = next(ET.iterparse(path, events=("start",)))[1].tag
    except (ET.ParseError, StopIteration) as e:
        raise ModelFileError(f"{path} is not a model: not an XML file ({e}); {READS}") from None
    if root != "net":
        raise ModelFileError(f"{path} is not an OpenVINO IR model: its root element is <{root}>, an IR's is <net>")
    weights = path.with_suffix(".bin")
    if not weights.is_file():
        raise ModelFileError(f"OpenVINO IR {path} needs its weights file {weights}, which is missing")

    import openvino as ov

    try:
        model = ov.Core().read_model(str(path))
    except Exception as e:  # noqa: BLE001 - OpenVINO raises plain RuntimeErrors with multi-line text
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Exception from")]
        raise ModelFileError(f"{path} is not a model OpenVINO can read: {' '.join(lines)}") from None

    def ports(values: Sequence[ov.Output]) -> tuple[DeclaredPort, ...]:
        out = []
        for p in values:
            pshape = p.get_partial_shape()
            shape = None if pshape.rank.is_dynamic else tuple(None if d.is_dynamic else d.get_length() for d in pshape)
            try:
                dtype = str(p.get_element_type().to_dtype())
            except Exception:  # noqa: BLE001 - a type numpy has no dtype for: its OpenVINO name
                dtype = p.get_element_type().get_type_name()
            out.append(DeclaredPort(p.get_any_name(), dtype, shape, (None,) * len(shape or ())))
        return tuple(out)

    return ModelDeclaration(path, "openvino-ir", ports(model.inputs), ports(model.outputs))


def check_input_shapes(model: ModelDeclaration, shapes: Mapping[str, Sequence[int]], given_by: str = "shapes"
                       ) -> None:
    """ValueError unless every shape names an input of the model and fits its rank and fixed dims."""
    for name, shape in shapes.items():
        port = model.input(name)
        if port is None:
            raise ValueError(f"{given_by} {name}=...: the model has no input {name!r} (its inputs: "
                             f"{', '.join(p.name for p in model.inputs) or 'none'})")
        if not port.fits(shape):
            raise ValueError(f"{given_by} {name}={','.join(map(str, shape))} does not fit input {name!r} of shape "
                             f"{port.shape_text()}")


def concrete_input_shapes(model: ModelDeclaration, pinned: Mapping[str, Sequence[int]] | None = None) -> ShapeChoice:
    """A concrete shape for every input: pinned ones as given, static ones as declared, an open batch dim (dim 0,
    the only open one) as 1; inputs with other open dims are returned as unresolved."""
    pinned = dict(pinned or {})
    shapes: dict[str, tuple[int, ...]] = {}
    picked: dict[str, tuple[int, ...]] = {}
    unresolved = []
    for port in model.inputs:
        if port.name in pinned:
            shapes[port.name] = tuple(int(d) for d in pinned[port.name])
        elif port.is_static:
            shapes[port.name] = tuple(d for d in port.shape or () if d is not None)  # static: every dim
        elif port.shape is not None and port.open_dims == [0]:
            shapes[port.name] = picked[port.name] = (1, *(d for d in port.shape[1:] if d is not None))
        else:
            unresolved.append(port)
    return ShapeChoice(shapes, picked, tuple(unresolved))


__all__ = ["DeclaredPort", "ModelDeclaration", "ModelFileError", "ShapeChoice", "check_input_shapes",
           "concrete_input_shapes", "inspect_model"]
