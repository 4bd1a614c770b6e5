"""ONNX's backend node cases of the installed onnx, materialized once on disk and read back.

onnx 1.2x wheels no longer ship ``onnx/backend/test/data/node``; ``load_node_model_tests()`` builds the cases
(model, inputs, expected outputs) in memory from onnx's own case generators. They are written once into
``$NPURT_CONFORMANCE_CACHE`` (default ``~/.cache/npurt/onnx-node-cases/<onnx version>/``) in the layout that
``backend-test-tools generate-data`` writes and that ONNX Runtime's ``onnx_test_runner`` reads::

    <case>/model.onnx
    <case>/test_data_set_0/input_<k>.pb   TensorProto, or SequenceProto / OptionalProto / MapProto per port type
    <case>/test_data_set_0/output_<k>.pb

The whole directory appears at once (built in a temporary sibling, then renamed), so processes that
materialize it at the same time never see a half-written case; the loser of the race drops its copy.

IR versions: the models are written exactly as onnx built them. onnx stamps each one with the oldest IR
version its opset imports allow (``make_model_gen_version``), so no model can be lowered further without
claiming an IR older than its opsets need. ONNX Runtime's own backend-test runner does not rewrite IR
versions either (its ``prepare`` only skips opsets that onnx has not released, which are none of these).
A model whose IR the installed ONNX Runtime does not accept is therefore the engine's error, which npurt
must then refuse as well; ONNX Runtime 1.32 accepts IR <= 14, which covers every case of onnx 1.23.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

INDEX = "index.json"  # written last into the temporary copy: a cache dir with it is complete
DATA_SET = "test_data_set_0"

# ONNX element types that plain numpy cannot carry (numpy_helper returns ml_dtypes arrays for them) or that are
# not numbers: a port of one of these is out of scope for npurt's run() (dict of numpy arrays).
NUMPY_LESS_TYPES = frozenset({
    TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ, TensorProto.UINT4, TensorProto.INT4, TensorProto.FLOAT4E2M1,
    *(getattr(TensorProto, n) for n in ("FLOAT8E8M0", "UINT2", "INT2") if hasattr(TensorProto, n)),
})
NON_NUMERIC_TYPES = frozenset({TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.COMPLEX128,
                               TensorProto.UNDEFINED})


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "npurt" / "onnx-node-cases" / onnx.__version__
    return Path(os.environ.get("NPURT_CONFORMANCE_CACHE", default))


# ------------------------------------------------------------------------------------------- writing
def _value_proto(value: Any, port: onnx.ValueInfoProto) -> Any:
    """A case's input/output value as the proto that its port's type calls for."""
    kind = port.type.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.from_list(value, port.name)
    if kind == "optional_type":
        return numpy_helper.from_optional(value, port.name)
    if kind == "map_type":
        return numpy_helper.from_dict(value, port.name)
    if isinstance(value, TensorProto):  # onnx keeps bfloat16 / float8 / int4 data as TensorProto
        return value
    return numpy_helper.from_array(np.asarray(value), port.name)


def _write_case(case_dir: Path, model: onnx.ModelProto, inputs: list[Any], outputs: list[Any]) -> None:
    data = case_dir / DATA_SET
    data.mkdir(parents=True)
    (case_dir / "model.onnx").write_bytes(model.SerializeToString())
    graph = model.graph
    for prefix, values, ports in (("input", inputs, graph.input), ("output", outputs, graph.output)):
        for k, value in enumerate(values):
            (data / f"{prefix}_{k}.pb").write_bytes(_value_proto(value, ports[k]).SerializeToString())


def materialize(root: Path | None = None) -> Path:
    """The cache dir holding every node case of the installed onnx; builds it on first use (~10 s)."""
    root = cache_dir() if root is None else root
    if (root / INDEX).exists():
        return root
    from onnx.backend.test.loader import load_node_model_tests

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # onnx's generators overflow casts on purpose
            cases = load_node_model_tests()
        names = []
        for case in cases:
            inputs, outputs = case.data_sets[0]
            _write_case(tmp / case.name, case.model, list(inputs), list(outputs))
            names.append(case.name)
        (tmp / INDEX).write_text(json.dumps({"onnx": onnx.__version__, "cases": sorted(names)}, indent=0))
        try:
            tmp.rename(root)  # atomic; replaces an empty dir, fails if another process got there first
        except OSError:
            if not (root / INDEX).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def case_names(root: Path | None = None) -> list[str]:
    root = materialize(root)
    return list(json.loads((root / INDEX).read_text())["cases"])


# ------------------------------------------------------------------------------------------- reading
@dataclass
class Port:
    """One graph input or output of a case: its name, what kind of value it is, and its element type."""

    name: str
    kind: str  # "tensor_type", "sequence_type", "optional_type", "map_type", "sparse_tensor_type"
    elem_type: int  # ONNX element type for a tensor port (0 otherwise)

    @property
    def out_of_scope(self) -> str:
        """Why npurt's run() cannot carry this port ("" if it can)."""
        if self.kind != "tensor_type":
            return f"{self.kind.removesuffix('_type')} port {self.name!r}"
        if self.elem_type in NUMPY_LESS_TYPES or self.elem_type in NON_NUMERIC_TYPES:
            return f"{TensorProto.DataType.Name(self.elem_type)} port {self.name!r}"
        return ""


@dataclass
class Case:
    """A node case read back from the cache: the model path, its ports, inputs and expected outputs."""

    name: str
    model_path: Path
    inputs: list[Port]
    outputs: list[Port]
    feeds: dict[str, Any]  # input name -> ndarray (or list / None / dict for non-tensor ports)
    expected: list[Any]  # per graph output, same kinds

    @property
    def out_of_scope(self) -> list[str]:
        """Why the case is out of npurt's scope: one line per port numpy/run() cannot carry."""
        return [r for r in (p.out_of_scope for p in self.inputs + self.outputs) if r]


def _port(value: onnx.ValueInfoProto) -> Port:
    kind = value.type.WhichOneof("value") or "undefined"
    elem = value.type.tensor_type.elem_type if kind == "tensor_type" else 0
    return Port(value.name, kind, elem)


def _read_value(path: Path, port: Port) -> Any:
    data = path.read_bytes()
    if port.kind == "sequence_type":
        proto: Any = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if port.kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    if port.kind == "map_type":
        proto = onnx.MapProto()
        proto.ParseFromString(data)
        return numpy_helper.to_dict(proto)
    proto = TensorProto()
    proto.ParseFromString(data)
    return numpy_helper.to_array(proto)  # bfloat16 / float8 / int4 come back as ml_dtypes arrays


def load_case(name: str, root: Path | None = None) -> Case:
    case_dir = materialize(root) / name
    model = onnx.load(str(case_dir / "model.onnx"), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    all_inputs = [_port(v) for v in model.graph.input]
    outputs = [_port(v) for v in model.graph.output]
    data = case_dir / DATA_SET
    feeds = {}
    for k, port in enumerate(all_inputs):
        path = data / f"input_{k}.pb"
        if path.exists():
            feeds[port.name] = _read_value(path, port)
    expected = [_read_value(data / f"output_{k}.pb", port) for k, port in enumerate(outputs)]
    inputs = [p for p in all_inputs if p.name not in initializers or p.name in feeds]
    return Case(name, case_dir / "model.onnx", inputs, outputs, feeds, expected)


def iter_cases(root: Path | None = None, substring: str = "") -> Iterator[str]:
    for name in case_names(root):
        if substring in name:
            yield name
