"""A decoder's model for a runner (option ``decoder``): the static form derived once, in the form each engine keeps its
cache in, and the facts a Generator needs.

- ONNX Runtime (every EP): the static form as an ONNX file; each ``past_key_values.{i}.*`` is carried state of a
  stream whose ``present`` is written into the same buffer (a pair in place, ``stream_state``), so the cache stays
  where it is between steps, one per stream (Generator). Where the device compiles static shapes (the NPU) the
  prefill chunk and the one-token step are two pinned signatures of that one graph. With ``batch`` (sizes), the
  batch form (``static_form.derive_batch``: its batch dim open, each size one more pinned signature) for
  ``batch.BatchGenerator``'s steps across sequences.
- OpenVINO: the static form made stateful (``apply_make_stateful_transformation``: the cache lives in the compiled
  model's variables, per infer request, so per stream), saved as IR at f32 (no weight compression); one compiled
  model with the sequence dim open serves the prefill and the steps over one state.

The cache and the logits keep the model's own (CPU) view whatever the options say: an NPU's HW view (NHWC FP16,
HCWNC4 BF16) would mangle a cache, and a Generator reads logits as floats.

Facts come from ``genai_config.json`` beside the model where there is one (ONNX Runtime GenAI's), else from the
graph: eos / bos / pad ids, the context length (``max_length`` may not exceed it), the vocabulary.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from .. import block_gather, onnx_graph
from ..options import DecoderSpec, RunnerOptions
from ..types import DecoderFacts, NpuError, NpuUnsupportedError, TensorDirection, TensorType
from . import folder as folder_of
from . import layout, merged, openvino_form, verify


@dataclass(frozen=True)
class PreparedDecoder:
    path: Path  # the model file the backend opens
    options: RunnerOptions  # the runner's options with what the decoder derives (state pairs, shapes, views)
    facts: DecoderFacts
    temporary: Path | None  # the derived form's folder where it goes with the runner (no cache_dir)
    # the check against the export (running while the runner compiles): waits for its verdict, the text of it for
    # DecoderFacts.verification; raises where the derived form is refused
    confirm: Callable[[], str]
    cancel: Callable[[], None]  # stops the check where the load failed before its verdict


def _config_names(config: dict[str, Any]) -> None:
    """genai_config may rename the ports; npurt takes the model builder's and optimum's own names only."""
    decoder = config.get("model", {}).get("decoder", {})
    expected = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value",
                "logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    for section in ("inputs", "outputs"):
        for key, name in (decoder.get(section) or {}).items():
            if key in expected and name != expected[key]:
                raise NpuUnsupportedError(f"genai_config.json names {section[:-1]} {key!r} {name!r}; npurt's decoder "
                                          f"takes the exporters' own name {expected[key]!r}")


def shapes_pinned(backend_name: str, device: str, static_shapes: bool | None) -> bool:
    """Whether a runner's shapes are pinned (each a compiled shape of its own, as an NPU compiles them): backend
    QNN, device NPU (in any case), or option ``static_shapes`` True. Whisper's steps take the same rule."""
    return backend_name == "QNN" or device.upper() == "NPU" or static_shapes is True


def prepare(model_dir_or_file: Path, backend_name: str, options: RunnerOptions) -> PreparedDecoder:
    """The decoder's derived form for ``backend_name`` (a model folder, or its model file: ``folder.resolve``),
    written once (into ``cache_dir`` where there is one, else a folder that goes with the runner), its check against
    the export started (``verify``; ``PreparedDecoder.confirm`` waits for it), and the options the runner then runs
    with."""
    spec = options.decoder
    assert spec is not None
    try:
        found = folder_of.resolve(model_dir_or_file)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    model_path = found.model
    if model_path.suffix.lower() != ".onnx":
        raise ValueError(f"option 'decoder' takes an ONNX export (input_ids, attention_mask, past_key_values.*); "
                         f"{model_path.name} is not one")
    config = found.genai_config
    _config_names(config)
    context = found.context_length
    if context is not None and spec.max_length > context:
        raise ValueError(f"option 'decoder': max_length {spec.max_length} is beyond the model's context length "
                         f"{context} ({', '.join(found.sources)})")
    openvino = backend_name == "OPENVINO"
    if openvino and spec.batch:
        raise NpuUnsupportedError(
            "option 'decoder' batch: batched steps run on the ONNX Runtime backends (a pooled cache bound in place); "
            "OpenVINO keeps a decoder's cache per infer request")
    if openvino and options.device == "NPU":
        raise NpuUnsupportedError(
            "option 'decoder' on OpenVINO's NPU: the NPU plugin runs decoders through its own static LLM pipeline "
            "(OpenVINO GenAI's NPUW), which npurt does not drive yet (untested here: no Intel NPU); use device='CPU' "
            "or 'GPU', or an ONNX Runtime backend")
    pinned = shapes_pinned(backend_name, options.device, options.static_shapes)
    folder = _folder(model_path, spec, backend_name, options, pinned)
    try:
        export = _export_facts(model_path, spec.max_length, found.cache_dims, folder, options.cache_dir is not None)
    except BaseException:
        if options.cache_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
        else:  # (an export refused leaves no entry in the cache)
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    shape, contrib, int8_activations = export.layout, export.contrib, export.int8_activations
    try:
        if shape.vocab is None:
            raise NpuUnsupportedError(f"{model_path.name}: the logits' last dim (the vocabulary) is not fixed")
        if openvino:  # OpenVINO converts the export, or refuses naming what it cannot convert (openvino_form)
            make, cache = openvino_form.form_of(contrib, partial(_onnx_file, sliced=True),
                                                _standard_gather_file if block_gather.OP in contrib else None)
            path = _derived(make, model_path, shape, folder, options)
            # compiled fresh from the derived IR every load, never from a compiled-model cache: OpenVINO 2026.4's
            # export_model / import_model (and its own CACHE_DIR) of these stateful models gives NaN logits (measured:
            # fresh compile 508, imported blob NaN, argmax 0), which npurt's cache served as SUCCESS
            logits_view = {(TensorDirection.OUTPUT, layout.LOGITS): TensorType.CPU}
            derived = replace(options, cache_dir=None, tensor_types={**options.tensor_types, **logits_view})
        else:
            make = partial(_onnx_file, batched=bool(spec.batch), sliced=not pinned and not spec.batch,
                           copy_weights=pinned)
            path = _derived(make, model_path, shape, folder, options)
            views = {**options.tensor_types, (TensorDirection.OUTPUT, layout.LOGITS): TensorType.CPU}
            for pair in shape.pairs:
                views[(TensorDirection.INPUT, pair.past)] = TensorType.CPU
                views[(TensorDirection.OUTPUT, pair.present)] = TensorType.CPU
            shape_sets: tuple[dict[str, tuple[int, ...]], ...] = ()
            if pinned:
                # the batch form's cache has its batch dim open too: each signature pins it (B=1 form: fixed)
                shape_sets = tuple({layout.INPUT_IDS: (b, s), layout.POSITION: (b,),
                                    **({p.past: (b, *p.shape[1:]) for p in shape.pairs} if spec.batch else {})}
                                   for b, s in dict.fromkeys([(1, spec.prefill_chunk), (1, 1),
                                                              *((b, 1) for b in spec.batch)]))
            derived = replace(options, tensor_types=views, state_pairs={p.past: p.present for p in shape.pairs},
                              shape_sets=shape_sets, shapes=shape_sets[0] if shape_sets else {})
            cache = "stream buffers, written in place (past and present bound to one buffer)"
        pad = found.pad_token_id or 0
        engine = "openvino" if openvino else "onnxruntime"
        batched = max(spec.batch, default=1)
        check = verify.start(model_path, path, shape, engine, spec.prefill_chunk, path.parent, pad,
                             int8_activations=int8_activations, prepack="MatMulNBits" in contrib, batch=batched,
                             engine_options=options.engine_options if openvino else None)

        def confirm() -> str:
            verdict = check.verdict()
            if verdict.get("proof") == "parts":
                head = verdict.get("lm_head")
                return (f"by its parts on {engine}: the export's nodes and weights unchanged"
                        + (f" (its {head} LM head run on the last row only)" if head else "")
                        + ", the cache read by GroupQueryAttention alone, npurt's ports exact, the attention's "
                        f"{verdict['configurations']} configuration(s) with past and present in one buffer as with "
                        "a growing past" + (", and the LM head's last row of a run as that row alone" if head else "")
                        + f", within {verdict['max_diff']:.2g} (tolerance {verdict['tolerance']:.2g}) on "
                        f"{verdict['shapes']} prompt, chunk and step shapes")
            checked = (f"logits within {verdict['max_diff']:.2g} of the export's (tolerance "
                       f"{verdict['tolerance']:.2g}) on {engine}, a {verdict['prompt_tokens']}-id prompt in one run "
                       f"and in chunks, then {verdict['steps']} steps")
            if batched > 1:
                checked += f"; {batched} rows batched (one idle), each against the export alone"
            return checked
        facts = DecoderFacts(max_length=spec.max_length, prefill_chunk=spec.prefill_chunk, vocab_size=shape.vocab,
                             layers=len(shape.pairs) // 2, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                             context_length=context, eos_token_ids=found.eos_token_ids,
                             bos_token_id=found.bos_token_id,
                             pad_token_id=pad, pinned=pinned and not openvino,
                             cache=cache, config=", ".join(str(found.folder / n) for n in found.sources) or None,
                             contrib_ops=contrib, attention=shape.attention, batch=spec.batch)
    except BaseException:
        if options.cache_dir is None:  # (a temporary folder: no runner is there to remove it)
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return PreparedDecoder(path, derived, facts, None if options.cache_dir is not None else folder, confirm,
                           check.cancel)


@dataclass(frozen=True)
class ExportFacts:
    """What the derivation reads from the export's graph: its layout, the com.microsoft operators it uses, whether
    its MatMulNBits quantize their activations to int8 (accuracy level 4: the check's tolerance)."""

    layout: layout.Layout
    contrib: tuple[str, ...]
    int8_activations: bool

    def as_json(self) -> dict[str, object]:
        return {"layout": self.layout.as_json(), "contrib": list(self.contrib),
                "int8_activations": self.int8_activations}


_FACTS = "export.json"  # an ExportFacts beside the derived form in npurt's cache: a cached load reads no graph


def _export_facts(model_path: Path, max_length: int, cache_dims: dict[str, tuple[int, str]], folder: Path,
                  kept: bool) -> ExportFacts:
    """The export's facts: from the cache folder where an earlier load kept them (``kept``), else read from its
    graph without its weights (ONNX's messages, ``onnx_proto``: no onnx import) and kept there."""
    if kept:
        try:
            value = json.loads((folder / _FACTS).read_text())
            return ExportFacts(layout.Layout.from_json(value["layout"]), tuple(value["contrib"]),
                               bool(value["int8_activations"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        skeleton = onnx_graph.read_skeleton(model_path)
        weightless = skeleton.model
    except ValueError as e:
        raise NpuError(f"cannot read ONNX model {model_path}: {e}") from None
    try:
        merged.resolve_cache_branch(weightless)
        shape = layout.read(weightless, max_length, skeleton.weight_dims, cache_dims)
    except ValueError as e:
        raise NpuUnsupportedError(f"{model_path.name}: {e}") from None
    nodes = weightless.graph.node
    facts = ExportFacts(shape, tuple(sorted({n.op_type for n in nodes if n.domain == "com.microsoft"})),
                        any(n.op_type == "MatMulNBits" and any(a.name == "accuracy_level" and a.i == 4
                                                                for a in n.attribute) for n in nodes))
    if kept:
        with contextlib.suppress(OSError):  # (a cache that cannot be written: the next load reads the graph again)
            verify.keep_json(folder / _FACTS, facts.as_json())
    return facts


def _folder(model_path: Path, spec: DecoderSpec, backend_name: str, options: RunnerOptions, pinned: bool) -> Path:
    """Where the derived model goes: a folder of npurt's cache (kept, keyed by the model and the decoder's
    settings), else a temporary one removed with the process's last reference to the runner. Keyed by the files
    beside the model too: its external data (its weights; the static form links them), and the configs the layout
    reads (genai_config.json, config.json), as ``cache.ModelCache.content_hash`` keys a model with external data."""
    if options.cache_dir is not None:
        stat = model_path.stat()
        siblings = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_path.parent.iterdir()
                          if p.is_file() and p != model_path)
        key = hashlib.sha256(json.dumps([str(model_path.resolve()), stat.st_size, stat.st_mtime_ns,
                                         spec.max_length, backend_name == "OPENVINO", pinned, _VERSION, siblings,
                                         *(["batch"] if spec.batch else [])]).encode())
        folder = options.cache_dir / "decoders" / key.hexdigest()[:32]
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return Path(tempfile.mkdtemp(prefix="npurt-decoder-"))


def _derived(make: Callable[[Path, layout.Layout, Path], Path], model_path: Path, shape: layout.Layout, folder: Path,
             options: RunnerOptions) -> Path:
    """``make``'s file in ``folder``, made by one thread at a time (runners made at once over one cache_dir wrote
    the same partial file); a temporary folder goes where it fails (no runner is there to remove it)."""
    with _FOLDERS_LOCK:
        lock = _FOLDER_LOCKS.setdefault(folder, threading.Lock())
    try:
        with lock:
            return make(model_path, shape, folder)
    except BaseException:
        if options.cache_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
        raise


_FOLDERS_LOCK = threading.Lock()
_FOLDER_LOCKS: dict[Path, threading.Lock] = {}  # a folder of derived models -> the lock of its derivation

_VERSION = 8  # of the derivation and its facts: a change to static_form or openvino_convert makes new cache entries


def _onnx_file(model_path: Path, shape: layout.Layout, folder: Path, batched: bool = False, *,
               sliced: bool = False, copy_weights: bool = False) -> Path:
    """The static form as an ONNX file in ``folder``, derived from the export's graph without its weights where it is
    not there: the form's weights are the export's own bytes, linked beside it (``onnx_external``); ``batched``: the
    batch form, its batch dim open (``static_form.derive_batch``); ``sliced``: see ``static_form.derive``;
    ``copy_weights``: the weights copied, not linked (see ``onnx_external.write``)."""
    path = folder / ("decoder_batch.onnx" if batched else "decoder_static.onnx")
    if not path.exists():
        from .. import onnx_external
        from . import static_form  # ONNX's messages and the graph builder: imported only where a form is made

        try:
            skeleton = onnx_graph.read_skeleton(model_path)
            model = skeleton.model
        except ValueError as e:
            raise NpuError(f"cannot read ONNX model {model_path}: {e}") from None
        merged.resolve_cache_branch(model)
        form = static_form.derive(model, shape.max_length, weight_dims=skeleton.weight_dims,
                                  batch=None if batched else 1, sliced=sliced, cache_dims=shape.cache_dims)
        try:
            # (a runner that edits the graph for an NPU's views loads it with onnx, which takes no hard link)
            onnx_external.write(form.model, skeleton, path, link=not copy_weights)
        except ValueError as e:  # (an external data file the export names is not there)
            raise NpuError(f"cannot read ONNX model {model_path}: {e}") from None
        except OSError as e:
            raise NpuError(f"cannot write the static form of {model_path.name} into {folder}: {e}") from None
    return path


def _standard_gather_file(model_path: Path, folder: Path) -> Path:
    """The export with its GatherBlockQuantized in standard operators (``block_gather``: OpenVINO's frontend does
    not convert it), its weights the export's own, linked; verified with the form made from it."""
    from .. import onnx_external

    path = folder / "decoder_standard_gather.onnx"
    try:
        skeleton = onnx_graph.read_skeleton(model_path)
        model = skeleton.model
        block_gather.rewrite(model, {w.name: w.elem_type for w in skeleton.weights.values()})
        onnx_external.write(model, skeleton, path)
    except ValueError as e:  # (a GatherBlockQuantized of other settings; an external data file not there)
        raise NpuUnsupportedError(f"{model_path.name}: {e}") from None
    except OSError as e:
        raise NpuError(f"cannot write {path.name} into {folder}: {e}") from None
    return path
