"""OpenVINO's form of a decoder (option ``decoder`` on OPENVINO): the cache in the compiled model's variables
(ReadValue / Assign, ``openvino_convert``: one set per infer request, so per stream), saved as IR at f32 (no weight
compression), one compiled model with the sequence dim open for the prefill and the steps. Two forms:

- standard attention (the cache grown by Concat): npurt's static form (``static_form``, a cache of max_length rows
  written at ``position``) made stateful.
- com.microsoft ``GroupQueryAttention`` (ONNX Runtime GenAI's model builder form): with a static past the stateful
  model fails at its first infer (measured), so the export itself is made stateful with the cache's sequence dim
  left open, as OpenVINO GenAI's models are: the state grows by the S rows of each run. One input ``position``
  int64 [1] replaces ``attention_mask``: the graph computes it as position + S ones (from a Range comparison, not a
  ConstantOfShape), and the export's own mask subgraph derives ``seqlens_k`` from it. Each GroupQueryAttention is
  replaced by standard operations (``openvino_convert``: OpenVINO's own is an internal operation its IR reader does
  not read back), in the pattern OpenVINO's CPU plug-in fuses with the cache kept in place. A run appends its S rows
  to those the state holds, and fails (naming the check) unless ``position`` is their count: ``DecoderFacts.cache``
  is ``GROWING`` for this form, and the caller cuts the state for a run from an earlier position (a new prompt: a
  reset; a rewind: the state's first ``position`` rows set back, as OpenVINO GenAI does): ``Generator`` does.

OpenVINO decides what it runs, not a list of names: the export is converted by OpenVINO's ONNX frontend
(``convert_partially``), and operators it has no conversion for (or whose conversion fails, or whose settings the
growing form does not take) make an NpuUnsupportedError naming them, so AUTO moves on, before anything is compiled.
Conversion runs in a child process: OpenVINO's reader and save_model hold the weights more than once on the way,
and a process seldom hands that memory back (measured on a 75 MB decoder: 320 MiB added in-process, 188 with the
conversion in a child, against 184 for OpenVINO compiling the export).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from .. import onnx_external
from ..types import NpuError, NpuUnsupportedError
from . import layout

GROWING = "growing"  # DecoderFacts.cache of the GroupQueryAttention form: a run starts where the state ends
STATIC = "OpenVINO state (the compiled model's variables, one set per stream)"
GROWING_ATTENTION = "GroupQueryAttention"  # the operator whose exports take the growing form
_UNCONVERTED = 3  # openvino_convert.UNCONVERTED (not imported: it imports OpenVINO, which stays in the child)
_CHILD = Path(__file__).with_name("openvino_convert.py")  # run as a script: OpenVINO's memory stays in the child


Source = Callable[[Path, Path], Path]  # (the export, the folder) -> the ONNX file OpenVINO's frontend reads


def form_of(contrib_ops: tuple[str, ...], onnx_file: Callable[[Path, layout.Layout, Path], Path],
            source: Source | None = None) -> tuple[Callable[[Path, layout.Layout, Path], Path], str]:
    """The form an export with these com.microsoft operators takes on OpenVINO: its maker (model_path, layout,
    folder) -> the IR's path, and ``DecoderFacts.cache``. ``onnx_file`` writes npurt's static form as ONNX;
    ``source`` (where given) makes the file the frontend reads in place of the export (a copy in standard operators
    where it has some the frontend does not convert), removed once converted."""
    reads = source or (lambda model_path, folder: model_path)
    if GROWING_ATTENTION in contrib_ops:
        return partial(growing, reads), GROWING
    return partial(stateful, onnx_file, reads), STATIC


def stateful(onnx_file: Callable[[Path, layout.Layout, Path], Path], source: Source, model_path: Path,
             shape: layout.Layout, folder: Path) -> Path:
    """The static form (written by ``onnx_file``) as OpenVINO IR with the cache as the model's variables; the ONNX
    form is removed once converted."""
    path = folder / "decoder_stateful.xml"
    if path.exists():
        return path
    read = source(model_path, folder)
    onnx_path = onnx_file(read, shape, folder)
    _convert(onnx_path, path, shape, growing=False, named=model_path.name)
    for made in (onnx_path, *([read] if read != model_path else [])):
        _remove(made)
    return path


def growing(source: Source, model_path: Path, shape: layout.Layout, folder: Path) -> Path:
    """The export itself as OpenVINO IR, ``position`` in place of its mask, the cache as variables that grow."""
    path = folder / "decoder_growing.xml"
    if not path.exists():
        read = source(model_path, folder)
        _convert(read, path, shape, growing=True, named=model_path.name)
        if read != model_path:
            _remove(read)
    return path


def _remove(onnx_path: Path) -> None:
    """An ONNX file npurt wrote, and the export's weights linked (or copied) beside it."""
    for linked in onnx_external.linked_files(onnx_path):
        linked.unlink(missing_ok=True)
    onnx_path.unlink(missing_ok=True)


def _convert(source: Path, path: Path, shape: layout.Layout, *, growing: bool, named: str) -> None:
    import subprocess  # (only where a form is converted: not on the ONNX Runtime backends' loads)

    draft = path.with_name(f"{path.stem}.{os.getpid()}.partial.xml")  # (other processes may write theirs)
    pairs = json.dumps({p.past: p.present for p in shape.pairs})
    done = subprocess.run([sys.executable, str(_CHILD), str(source), str(draft), pairs,
                           "growing" if growing else "static", json.dumps([shape.kv_heads, shape.head_dim])],
                          capture_output=True, text=True)
    if done.returncode == _UNCONVERTED:
        reasons: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
        raise NpuUnsupportedError(f"{named}: OpenVINO cannot convert it ({'; '.join(reasons)}): use an ONNX Runtime "
                                  "backend")
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
        if last.startswith("cannot read ONNX model"):
            raise NpuError(last)
        raise NpuError(f"OpenVINO cannot make the decoder's {'growing' if growing else 'static'} form stateful: "
                       f"{last}")
    draft.with_suffix(".bin").replace(path.with_suffix(".bin"))
    draft.replace(path)
