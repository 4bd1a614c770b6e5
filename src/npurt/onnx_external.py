"""A model derived from another's skeleton, written beside that model's own weights instead of a copy of them.

A derived form (a decoder's static form: nodes added around the export) leaves the export's weights as they are.
Loading them into protobuf objects to save them again cost most of a decoder's load (measured on a 540 MB export:
``ByteSize`` 6.9 s and ``SerializeToString`` 4.0 s of a 19 s load, and the whole model's size in memory). Here the
derived graph is written with each weight the skeleton left out (``onnx_graph.Weight``) added back as an initializer
whose data is external: at its offset in the export's own file (weights inline in the model) or in the export's
external data file. Those files are hard-linked beside the derived model (ONNX Runtime and onnx refuse external data
reached through a symbolic link, and a path outside the model's folder); where a hard link cannot be made (another
file system) they are copied.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from . import onnx_proto
from .onnx_graph import Skeleton, Weight

if TYPE_CHECKING:
    import onnx


def write(model: onnx.ModelProto, skeleton: Skeleton, path: Path, *, link: bool = True) -> list[Path]:
    """Write ``model`` (made from ``skeleton.model``: the skeleton's weights are not in it) to ``path``, each of the
    skeleton's weights added back as an external initializer over the export's own bytes. Returns the files written
    beside ``path`` (the weight files, named ``<path.name>.w<i>``): hard links, or (``link`` False) copies, for a
    file that the onnx package will load (it refuses external data with more than one hard link, as a possible
    attack). OSError where a file cannot be linked or copied; ValueError where an external data file the export names
    is not in its folder."""
    present = {t.name for t in model.graph.initializer}
    linked: dict[Path, str] = {}  # the export's file -> its link's name beside path
    written: list[Path] = []

    def beside(source: Path) -> str:
        if source not in linked:
            name = f"{path.name}.w{len(linked)}"
            (_hard_link if link else _copy)(source, path.with_name(name))
            linked[source] = name
            written.append(path.with_name(name))
        return linked[source]

    sources: dict[str, Path] = {}  # an external data file's location -> the file (most weights share one)
    with open(skeleton.path, "rb") as export:
        for weight in skeleton.weights.values():
            if weight.name in present:
                continue
            if weight.offset >= 0 and not weight.external:  # its bytes inline in the export: named there
                tensor = _header(weight)
                _set_external(tensor, beside(skeleton.path), str(weight.offset), str(weight.length))
            else:  # (values in a typed field other than raw / packed float data stay inline, as parsed)
                tensor = _message(export, weight)
                if weight.external:
                    entries = {e.key: e.value for e in tensor.external_data}
                    location = entries.get("location", "")
                    if location not in sources:
                        sources[location] = _external_file(skeleton.path, location)
                    _set_external(tensor, beside(sources[location]), entries.get("offset"), entries.get("length"))
            model.graph.initializer.append(tensor)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(model.SerializeToString())
    partial.replace(path)
    return written


def places(skeleton: Skeleton) -> dict[str, tuple[Path, int, int] | None]:
    """Each weight's file, offset and length of its little-endian bytes (in the model's own file, or its external
    data file, links followed to the file they name); None where its values are in a typed field. ValueError where
    an external data file the model names is not in its folder."""
    found: dict[str, tuple[Path, int, int] | None] = {}
    files: dict[str, Path] = {}
    with open(skeleton.path, "rb") as model:
        for weight in skeleton.weights.values():
            if weight.offset >= 0 and not weight.external:
                found[weight.name] = (skeleton.path, weight.offset, weight.length)
            elif not weight.external:
                found[weight.name] = None
            else:
                entries = {e.key: e.value for e in _message(model, weight).external_data}
                location = entries.get("location", "")
                if location not in files:
                    files[location] = _external_file(skeleton.path, location).resolve()
                offset = int(entries.get("offset", 0))
                length = int(entries["length"]) if "length" in entries else files[location].stat().st_size - offset
                found[weight.name] = (files[location], offset, length)
    return found


def linked_files(path: Path) -> Iterator[Path]:
    """The weight files ``write`` put beside ``path``."""
    return (p for p in path.parent.glob(f"{path.name}.w*") if p.name[len(path.name) + 2:].isdigit())


def _message(export: BinaryIO, weight: Weight) -> onnx.TensorProto:
    """The weight's TensorProto as the file has it (an external one's is small: where its bytes are)."""
    tensor: onnx.TensorProto = onnx_proto.messages().TensorProto()
    start, end = weight.message
    tensor.ParseFromString(os.pread(export.fileno(), end - start, start))
    if not tensor.name:  # (a Constant node's value: named by the node's output)
        tensor.name = weight.name
    return tensor


def _header(weight: Weight) -> onnx.TensorProto:
    tensor: onnx.TensorProto = onnx_proto.messages().TensorProto()
    tensor.name, tensor.data_type = weight.name, weight.elem_type
    tensor.dims.extend(weight.dims)
    return tensor


def _set_external(tensor: onnx.TensorProto, location: str, offset: str | None, length: str | None) -> None:
    del tensor.external_data[:]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx_proto.messages().TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value


def _external_file(model_path: Path, location: str) -> Path:
    """The export's external data file (a symbolic link, as a Hugging Face cache has them, is followed: the hard
    link is to the file it names)."""
    source = model_path.parent / location
    if not location or os.path.isabs(location) or ".." in Path(location).parts or not source.is_file():
        raise ValueError(f"{model_path.name}: external data {location!r} is not a file in {model_path.parent}")
    return source


def _hard_link(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (kept where it is one already), else a copy made aside and renamed."""
    try:
        if target.exists() and os.path.samefile(source, target):
            return
        target.unlink(missing_ok=True)
        os.link(source, target)
    except OSError:
        _copy(source, target)


def _copy(source: Path, target: Path) -> None:
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.copyfile(source, partial)
    partial.replace(target)
