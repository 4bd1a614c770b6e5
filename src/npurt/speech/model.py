"""A Whisper export (optimum's ``automatic-speech-recognition-with-past`` folder) on an npurt backend: the encoder once
per 30-s window, then the decoder over the encoder's output, its caches kept between steps.

The folder's forms, by what it has:

- ``decoder_model.onnx`` + ``decoder_with_past_model.onnx`` (optimum writes both, with the merged one): the first
  runs the prompt and gives every layer's cross-attention keys and values (``present.{i}.encoder.*``) with the
  self-attention cache; those keys and values are kept for the whole window and fed to ``decoder_with_past`` at each
  step, which returns the self-attention cache grown by a row. Every backend runs these (OpenVINO included: it never
  sees the merged model's ``If``, which its CPU plug-in refuses).
- ``decoder_model_merged.onnx`` alone: the same two runs through its ``use_cache_branch``, on the ONNX Runtime
  backends only (OpenVINO: a clear error asking for the two files).
- On OPENVINO's CPU the steps run a stateful form of ``decoder_with_past`` (``openvino_state``): its
  self-attention cache stays in the plug-in as the variables of a stream of npurt's (an infer request of its own),
  as OpenVINO GenAI's decoder keeps it, instead of going out and back in every step. The prompt's rows (from
  ``decoder_model``) are the variables' value after the stream's reset; beam search reorders the rows through the
  form's ``beam_idx`` input, inside the plug-in. A window takes a stream at its first step and gives it back when
  ``release``d (streams are pooled: one per window decoded at once). The steps and the prompt's run go through
  ``execute_async`` + ``wait`` (OpenVINO's start_async: its own stream thread, as OpenVINO GenAI runs its decoder;
  faster than infer() on the calling thread on the shared 2-core VM, where the encoder is not). ``stateful=False``
  feeds the cache back as on the other backends; so do OpenVINO's other devices (the form is checked on its CPU).
- Where the runners' shapes are pinned (as a decoder's are in ``npurt.generate``: backend QNN, device NPU, or option
  ``static_shapes`` True; the stateful path aside) the steps run ``static_cache``'s form of ``decoder_with_past``:
  the self-attention cache at ``max_target_positions`` rows, the step's row given as ``position``, one compiled shape
  a row count instead of one a length. The window's cache (``DecoderCache.static``) is allocated once at that many
  rows; each step's new row (the form's only cache output) is written at its position in place. The form is checked
  against the export before first use (``static_cache.check``); where it cannot be made or fails, the steps feed the
  growing cache instead, saying why (``static_refused``), unless ``static_cache=True`` asked for it.

Each window's state (``DecoderCache``) belongs to its caller: one ``WhisperModel`` serves many threads (npurt's
runners are thread-safe). Beam search reorders a cache's rows (``DecoderCache.select``); the cross-attention
keys and values are the same for every row of a window and are never reordered.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..batch_rows import LEAST_COSINE, row_cosine
from ..generate.model import shapes_pinned
from . import openvino_state
from . import static_cache as static_module
from .decoder_cache import DecoderCache, repeat_first_row

ENCODER = "encoder_model.onnx"
DECODER = "decoder_model.onnx"
DECODER_WITH_PAST = "decoder_with_past_model.onnx"
DECODER_MERGED = "decoder_model_merged.onnx"

_CROSS_KEPT = 4  # released windows' cross-attention arrays kept for the next prompts' runs, at most
_PRESENT = re.compile(r"^present\.(\d+)\.(decoder|encoder)\.(key|value)$")


@dataclass(frozen=True)
class WhisperFiles:
    """The ONNX files of a Whisper folder."""

    folder: Path
    encoder: Path
    decoder: Path | None  # the prompt's run (no past)
    decoder_with_past: Path | None  # the steps
    merged: Path | None

    @classmethod
    def find(cls, folder: str | Path) -> WhisperFiles:
        root = Path(folder)
        if not root.is_dir():
            raise ValueError(f"a Whisper model folder (optimum's export) expected; {root} is not a folder")
        onnx = root / "onnx" if not (root / ENCODER).exists() and (root / "onnx" / ENCODER).exists() else root

        def maybe(name: str) -> Path | None:
            return onnx / name if (onnx / name).exists() else None

        encoder = maybe(ENCODER)
        if encoder is None:
            raise ValueError(f"{root}: no {ENCODER} (a Whisper folder as optimum exports it: {ENCODER}, "
                             f"{DECODER} and {DECODER_WITH_PAST}, or {DECODER_MERGED})")
        files = cls(root, encoder, maybe(DECODER), maybe(DECODER_WITH_PAST), maybe(DECODER_MERGED))
        if not (files.decoder and files.decoder_with_past) and files.merged is None:
            raise ValueError(f"{root}: no decoder: {DECODER} with {DECODER_WITH_PAST}, or {DECODER_MERGED}")
        return files


_IDENTITY: dict[int, np.ndarray] = {}


def _identity(rows: int) -> np.ndarray:
    """beam_idx for rows that continue themselves: [0 .. rows - 1] int32 (one array per count, never written to)."""
    order = _IDENTITY.get(rows)
    if order is None:
        order = _IDENTITY[rows] = np.arange(rows, dtype=np.int32)
    return order


class WhisperModel:
    """The encoder's and the decoder's runners over one folder, on one backend and device."""

    def __init__(self, folder: str | Path, backend: str = "AUTO", options: Mapping[str, Any] | None = None, *,
                 stateful: bool | None = None, static_cache: bool | None = None) -> None:
        """``stateful``: the self-attention cache as OpenVINO state (``openvino_state``). None: where OPENVINO runs on
        its CPU, falling back to the cache fed back (``state_refused`` says why) where the form cannot be made or
        fails its check; True: there or a ValueError / NpuError; False: never.
        ``static_cache``: the steps on ``static_cache``'s form (a cache of max_target_positions rows). None: where the
        shapes are pinned (``pinned``) and the stateful path is not taken, falling back to the growing cache
        (``static_refused`` says why) where the form cannot be made or fails its check; True: on any backend, or a
        ValueError / NpuError; False: never."""
        from ..factory import RunnerFactory, create_auto
        from ..types import NpuError

        self.files = WhisperFiles.find(folder)
        opts = dict(options or {})
        name = backend.upper()
        if stateful and name not in ("OPENVINO", "AUTO"):  # (before any runner is made)
            raise ValueError(f"stateful=True: the self-attention cache as OpenVINO state runs on OPENVINO's CPU "
                             f"(backend {name})")
        openvino_merged = self.files.decoder_with_past is None
        self._runners: list[Any] = []
        self._streams: list[Any] = []  # the stateful path's free streams
        # the stateful path's cross-attention keys and values of released windows, by frames: the next prompt's run
        # writes into them (18 MB for tiny.en: fresh arrays cost their pages' first touch every window)
        self._cross_free: list[dict[str, np.ndarray]] = []
        self._streams_lock = threading.Lock()
        # the derived forms' folder where no cache_dir keeps them (one for both: a stateful form refused before the
        # static one is tried leaves its files there too, removed at close)
        self._temporary: Path | None = None
        self.stateful = False
        self.state_refused: str | None = None  # why the stateful form was not used where it would have been
        self.static = False  # the steps run static_cache's form
        self.static_refused: str | None = None  # why the static form was not used where it would have been
        self.static_verdict: dict[str, object] | None = None  # its check against the export
        self.static_layout: static_module.StepLayout | None = None
        # the pinned path's row counts (beams) checked against their rows run alone: count -> (used, least cosine)
        self.batch_checks: dict[int, tuple[bool, float]] = {}
        if stateful and static_cache:
            raise ValueError("stateful=True and static_cache=True: the self-attention cache is one or the other")
        try:
            if name == "AUTO":
                self.encoder, choice = create_auto(self.files.encoder, opts)
                self._runners.append(self.encoder)
                name = choice.backend
            else:
                self.encoder = RunnerFactory.create_runner(name, self.files.encoder, opts)
                self._runners.append(self.encoder)
            self.backend = name
            self.pinned = shapes_pinned(name, str(opts.get("device") or ""), opts.get("static_shapes"))
            if self.files.decoder is not None and self.files.decoder_with_past is not None:
                self.decoder = RunnerFactory.create_runner(name, self.files.decoder, opts)
                self._runners.append(self.decoder)
                self.stateful = self._use_state(name, False if static_cache else stateful)
                if self.stateful:
                    try:
                        self.decoder_with_past = self._stateful_runner(self.files.decoder_with_past, opts)
                    except NpuError as e:
                        if stateful:
                            raise
                        self.stateful, self.state_refused = False, str(e)
                if not self.stateful and (static_cache or (static_cache is None and self.pinned)):
                    try:
                        self.decoder_with_past = self._static_runner(self.files.decoder_with_past, name, opts)
                        self.static = True
                    except NpuError as e:
                        if static_cache:
                            raise
                        self.static_refused = str(e)
                if not self.stateful and not self.static:
                    self.decoder_with_past = RunnerFactory.create_runner(name, self.files.decoder_with_past, opts)
                self._runners.append(self.decoder_with_past)
                self.merged = False
            else:
                if stateful:
                    raise ValueError(f"{self.files.folder}: stateful=True takes {DECODER_WITH_PAST}")
                if static_cache:
                    raise ValueError(f"{self.files.folder}: static_cache=True takes {DECODER_WITH_PAST}")
                if self.pinned:
                    self.static_refused = f"the static cache is derived from {DECODER_WITH_PAST}, not in the folder"
                if name == "OPENVINO" and openvino_merged:
                    raise ValueError(
                        f"{self.files.folder}: OpenVINO cannot run {DECODER_MERGED} (its CPU plug-in refuses the "
                        f"If on use_cache_branch with dynamic rank); export {DECODER} and {DECODER_WITH_PAST} "
                        "beside it (optimum writes them by default)")
                assert self.files.merged is not None
                self.decoder = RunnerFactory.create_runner(name, self.files.merged, opts)
                self._runners.append(self.decoder)
                self.decoder_with_past = self.decoder
                self.merged = True
        except BaseException:
            self.close()
            raise
        self._self_names, self._cross_names = self._cache_names()
        hidden_spec = next(s for s in self.encoder.output_specs if s.name == "last_hidden_state")
        self.d_model = hidden_spec.shape[-1]
        features = next(s for s in self.encoder.input_specs if s.name == "input_features")
        self.n_mels = int(features.shape[1]) if features.shape[1] else 80
        self.frames = int(features.shape[2]) if features.shape[2] else 3000

    def _use_state(self, backend: str, wanted: bool | None) -> bool:
        """Whether the steps run ``openvino_state``'s form: on OPENVINO where the encoder runs on OpenVINO's CPU
        (where the form is checked), unless ``wanted`` is False."""
        device = self.encoder.device_info.attached if backend == "OPENVINO" else ""
        if wanted and device != "CPU":
            raise ValueError(f"stateful=True: the self-attention cache as OpenVINO state runs on OPENVINO's CPU "
                             f"(backend {backend}{f', device {device}' if device else ''})")
        return device == "CPU" and wanted is not False

    def _stateful_runner(self, with_past: Path, opts: dict[str, Any]) -> Any:
        """The runner over ``openvino_state``'s form of ``with_past`` (derived into cache_dir, else a folder removed
        at close). Compiled fresh from the IR every load, never from a compiled-model cache: OpenVINO 2026.4's
        export / import of stateful models gives NaN logits (generate.model measured it), which a cache would
        serve."""
        from ..factory import RunnerFactory

        cache_dir = opts.get("cache_dir")
        folder = openvino_state.folder_for(with_past, Path(cache_dir)) if cache_dir else self._scratch()
        path = openvino_state.stateful_decoder(with_past, folder)
        # the cache at f32 as the form was checked (the CPU plug-in's own default compresses it to u8)
        engine = {**openvino_state.ENGINE_OPTIONS, **dict(opts.get("engine_options") or {})}
        derived = {k: v for k, v in opts.items() if k != "cache_dir"}
        return RunnerFactory.create_runner("OPENVINO", path, {**derived, "device": "CPU", "engine_options": engine})

    def _scratch(self) -> Path:
        """The derived forms' folder of this model (made once), removed at close."""
        if self._temporary is None:
            self._temporary = Path(tempfile.mkdtemp(prefix="npurt-whisper-"))
        return self._temporary

    def _static_runner(self, with_past: Path, backend: str, opts: dict[str, Any]) -> Any:
        """The runner over ``static_cache``'s form of ``with_past`` (derived into cache_dir, else a folder removed at
        close), its check against the export run while the runner compiles; NpuError / NpuUnsupportedError where
        the form cannot be made or is refused."""
        from ..factory import RunnerFactory

        cache_dir = opts.get("cache_dir")
        npu = backend == "QNN" or str(opts.get("device") or "").upper() == "NPU"
        folder = static_module.folder_for(with_past, Path(cache_dir), npu) if cache_dir else self._scratch()
        path, layout = static_module.static_decoder(with_past, folder, copy_weights=npu)
        check = static_module.check(with_past, path, layout, "openvino" if backend == "OPENVINO" else "onnxruntime",
                                   folder)
        derived = dict(opts)
        if npu:
            # the caches and the logits in the model's own (CPU) view, as generate's decoders take them: the NPU's
            # view (FP16 on QNN) converted in the graph, not by a host copy of every cache tensor every step
            for past, new_row in layout.pairs:
                derived[f"input_tensor_type.{past}"] = "CPU"
                derived[f"output_tensor_type.{new_row}"] = "CPU"
                cross = past.replace(".decoder.", ".encoder.")
                derived[f"input_tensor_type.{cross}"] = "CPU"
            derived[f"output_tensor_type.{static_module.LOGITS}"] = "CPU"
        try:
            runner = RunnerFactory.create_runner(backend, path, derived)
        except BaseException:
            check.cancel()
            raise
        try:
            self.static_verdict = check.verdict()
        except BaseException:
            runner.close()
            raise
        self.static_layout = layout
        return runner

    def _cache_names(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(present name, past name) of the self-attention and the cross-attention caches, by layer."""
        self_names: list[tuple[str, str]] = []
        cross_names: list[tuple[str, str]] = []
        for spec in self.decoder.output_specs:
            m = _PRESENT.match(spec.name)
            if m:
                past = f"past_key_values.{m.group(1)}.{m.group(2)}.{m.group(3)}"
                (self_names if m.group(2) == "decoder" else cross_names).append((spec.name, past))
        if not self_names or not cross_names:
            raise ValueError(f"{self.files.folder}: the decoder has no present.*.decoder/encoder.* outputs (an "
                             "export without its cache: optimum's task automatic-speech-recognition-with-past)")
        return self_names, cross_names

    def encode(self, features: np.ndarray) -> np.ndarray:
        """The encoder's output for one window's features [1, n_mels, frames]."""
        out: np.ndarray = self.encoder.run({"input_features": np.ascontiguousarray(features, np.float32)}
                                           )["last_hidden_state"]
        return out

    def prefill(self, hidden: np.ndarray, prompt: Sequence[int]) -> tuple[np.ndarray, DecoderCache]:
        """The prompt's run over one window: the logits of every prompt position [len, vocab] and the window's
        cache for one row (``DecoderCache.select`` makes more)."""
        ids = np.asarray([list(prompt)], np.int64)
        feeds: dict[str, np.ndarray] = {"input_ids": ids, "encoder_hidden_states": hidden}
        if self.merged:
            feeds.update(self._empty_past(hidden))
            feeds["use_cache_branch"] = np.zeros(1, np.bool_)
        if self.static:  # (before the prompt's run: a prompt past the static cache's rows has no place)
            assert self.static_layout is not None
            rows = self.static_layout.max_length
            if ids.shape[1] > rows:
                raise ValueError(f"a prompt of {ids.shape[1]} ids is longer than the decoder's {rows} positions")
        out = self._prefill_async(feeds, ids.shape[1], hidden.shape[1]) if self.stateful else self.decoder.run(feeds)
        self_kv = {past: out[present] for present, past in self._self_names}
        if self.static:  # the cache at its full rows, once a window; the prompt's rows first
            full = {}
            for past, kv in self_kv.items():
                full[past] = np.zeros((kv.shape[0], kv.shape[1], rows, kv.shape[3]), kv.dtype)
                full[past][:, :, :kv.shape[2]] = kv
            self_kv = full
        cache = DecoderCache(self_kv, {past: out[present] for present, past in self._cross_names},
                             hidden if self.merged else None, stateful=self.stateful, static=self.static,
                             position=ids.shape[1])
        return out["logits"][0], cache

    def _prefill_async(self, feeds: dict[str, np.ndarray], length: int, frames: int) -> dict[str, np.ndarray]:
        """``decoder.run(feeds)`` on OpenVINO's own stream thread (start_async + wait, as the steps run): 73 against
        97 ms for tiny.en's prompt on the 2-core VM (interleaved; the encoder gains nothing so: 606 against 554).
        Its outputs' shapes follow from the prompt's length and the encoder's frames; the cross-attention keys and
        values go into a released window's arrays where one of these frames is free (``release``)."""
        from ..tensor import NpuTensor
        from ..types import NpuError, StatusCode, TensorType

        runner = self.decoder
        out: dict[str, np.ndarray] = {}
        outputs = []
        reused = self._free_cross(frames)
        for spec in runner.output_specs:
            dims = list(spec.shape)
            wanted = ((1, length, dims[-1]) if spec.name == "logits" else
                      (1, dims[1], frames if ".encoder." in spec.name else length, dims[3]))
            if not all(wanted):  # (a dim the export leaves open where fixed ones were expected)
                return dict(runner.run(feeds))
            shape = tuple(int(d or 0) for d in wanted)
            info = runner.get_tensor_info_by_name(spec.name, TensorType.CPU)
            kept = reused.get(spec.name.replace("present.", "past_key_values.", 1))
            out[spec.name] = kept if kept is not None and kept.shape == shape and \
                kept.dtype == info.data_type.numpy else np.empty(shape, info.data_type.numpy)
            outputs.append(NpuTensor(info.replace(shape=shape), out[spec.name]))
        inputs = [NpuTensor(runner.get_tensor_info_by_name(spec.name, TensorType.CPU).replace(
            shape=feeds[spec.name].shape), np.ascontiguousarray(feeds[spec.name])) for spec in runner.input_specs]
        job = runner.execute_async([inputs], [outputs])
        if job.status is not StatusCode.SUCCESS or runner.wait(job) is not StatusCode.SUCCESS:
            raise NpuError(f"the decoder's prompt run failed: {runner.last_error}")
        return out

    def _free_cross(self, frames: int) -> dict[str, np.ndarray]:
        """A released window's cross-attention arrays of ``frames`` frames, taken from the pool (else none)."""
        with self._streams_lock:
            for n, arrays in enumerate(self._cross_free):
                if all(a.shape[2] == frames for a in arrays.values()):
                    return self._cross_free.pop(n)
        return {}

    def _empty_past(self, hidden: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {}
        for spec in self.decoder.input_specs:
            if spec.name.startswith("past_key_values."):
                heads, head_dim = int(spec.shape[1] or 0), int(spec.shape[3] or 0)
                feeds[spec.name] = np.zeros((1, heads, 0 if ".decoder." in spec.name else hidden.shape[1], head_dim),
                                            np.float32)
        return feeds

    def step(self, cache: DecoderCache, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """One id per row fed after the rows' caches; their logits [rows, vocab]. The cache grows by a row."""
        tokens = np.asarray(ids, np.int64).reshape(-1, 1)
        if tokens.shape[0] != cache.rows:
            raise ValueError(f"{tokens.shape[0]} ids for a cache of {cache.rows} rows")
        if cache.stateful:
            return self._stateful_step(cache, tokens)
        if cache.static:
            return self._static_step(cache, tokens)
        feeds: dict[str, np.ndarray] = {"input_ids": tokens, **cache.self_kv, **cache.cross_kv}
        if self.merged:
            assert cache.hidden is not None
            feeds["encoder_hidden_states"] = repeat_first_row(cache.hidden, cache.rows)
            feeds["use_cache_branch"] = np.ones(1, np.bool_)
        out = self.decoder_with_past.run(feeds)
        cache.self_kv = {past: out[present] for present, past in self._self_names}
        logits: np.ndarray = out["logits"][:, -1]
        return logits

    def _static_step(self, cache: DecoderCache, tokens: np.ndarray) -> np.ndarray:
        """One step on the static form: the cache of max_target_positions rows as it is, the step's position; the new
        row it returns written at that position (the cache's only change)."""
        assert self.static_layout is not None
        position = cache.position
        if position >= self.static_layout.max_length:
            raise ValueError(f"the decoder has {self.static_layout.max_length} positions; a step at position "
                             f"{position} has none")
        rows = tokens.shape[0]
        alone: list[dict[str, np.ndarray]] = []
        check = self.batch_checks.get(rows)
        if rows > 1 and self.pinned and check is None:
            out, alone = self._check_batch(cache, tokens, position)
            check = self.batch_checks[rows]
        elif check is None or check[0]:
            out = self._static_run(cache, tokens, position, slice(None))
        if check is not None and not check[0]:
            # the device computes this row count wrong: one row at a time (the batch-1 shape, checked at load)
            alone = alone or [self._static_run(cache, tokens[r:r + 1], position, slice(r, r + 1))
                              for r in range(rows)]
            out = {name: np.concatenate([a[name] for a in alone]) for name in alone[0]}
        for past, new_row in self.static_layout.pairs:
            cache.self_kv[past][:, :, position] = out[new_row][:, :, 0]
        cache.position = position + 1
        logits: np.ndarray = out[static_module.LOGITS][:, -1]
        return logits

    def _static_run(self, cache: DecoderCache, tokens: np.ndarray, position: int, rows: slice
                    ) -> dict[str, np.ndarray]:
        """The static form over ``rows`` of the cache (the form writes nothing: the host writes its new rows)."""
        def part(array: np.ndarray) -> np.ndarray:
            return array if array.shape[0] == 1 else array[rows]
        out: dict[str, np.ndarray] = self.decoder_with_past.run(
            {"input_ids": tokens, static_module.POSITION: np.array([position], np.int64),
             **{k: part(v) for k, v in cache.self_kv.items()}, **{k: part(v) for k, v in cache.cross_kv.items()}})
        return out

    def _check_batch(self, cache: DecoderCache, tokens: np.ndarray, position: int
                     ) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
        """A row count's first step on a pinned device, run together and each row alone: a device that computes a
        batch row wrong (seen on Qualcomm's HTP for an encoder's [2, 16]) would give wrong beams as SUCCESS. Where a
        row's logits and new cache rows part from its run alone (cosine under ``batch_rows.LEAST_COSINE``), that row
        count runs a row at a time from then on (``batch_checks``, and a warning saying so)."""
        rows = tokens.shape[0]
        out = self._static_run(cache, tokens, position, slice(None))
        alone = [self._static_run(cache, tokens[r:r + 1], position, slice(r, r + 1)) for r in range(rows)]
        worst = 1.0
        assert self.static_layout is not None
        new_rows = [new_row for _, new_row in self.static_layout.pairs]
        for r in range(rows):  # the row's logits and the new cache rows it returns, against the row alone
            a = np.concatenate([np.asarray(out[static_module.LOGITS][r, -1], np.float64).ravel(),
                                *(np.asarray(out[n][r], np.float64).ravel() for n in new_rows)])
            b = np.concatenate([np.asarray(alone[r][static_module.LOGITS][0, -1], np.float64).ravel(),
                                *(np.asarray(alone[r][n][0], np.float64).ravel() for n in new_rows)])
            worst = min(worst, row_cosine(a, b))
        ok = worst >= LEAST_COSINE
        with self._streams_lock:
            self.batch_checks[rows] = (ok, worst)
        if not ok:
            warnings.warn(f"{self.backend}: the decoder's steps of {rows} rows give a row's logits other than the row "
                          f"alone (cosine {worst:.4f}); steps of {rows} rows run a row at a time", RuntimeWarning,
                          stacklevel=4)
        return out, alone

    def _stateful_step(self, cache: DecoderCache, tokens: np.ndarray) -> np.ndarray:
        """One step on the stateful form: the tensors of this row count made once (the runner's plan for them is
        then found, not made, every step), the ids and each row's source row written in place. The logits are the
        output array's rows (valid until the cache's next step)."""
        from ..types import NpuError, StatusCode

        if cache.released:
            raise ValueError("a step on a released cache (its state went back with its stream)")
        if cache.stream is None:  # the window's first step: a stream whose variables start as the prompt's rows
            if cache.order is not None:
                # rows chosen before the first step (beam search's and sampling's copies of the prompt's row) are
                # gathered here, on the prompt's few rows: the CPU plug-in's fused stateful attention crashes
                # (a segmentation fault, OpenVINO 2026.4) where the first run after a reset gathers another number
                # of rows than its initial value holds
                cache.self_kv = {k: np.ascontiguousarray(v[cache.order]) for k, v in cache.self_kv.items()}
                cache.order = None
            cache.stream = self._take_stream()
            cache.runs = {}
        assert cache.runs is not None
        rows = tokens.shape[0]
        run = cache.runs.get(rows)
        if run is None:
            run = cache.runs[rows] = self._tensors(rows, cache)
        ids, beam, logits, (inputs, outputs) = run
        ids[...] = tokens
        beam[...] = cache.order if cache.order is not None else _identity(rows)
        # on OpenVINO's own stream thread (start_async + wait), as OpenVINO GenAI runs its decoder: a synchronous
        # infer() on the calling thread took 13.9-14.4 ms a step against 9.7-10.6 this way (tiny.en, the 2-core VM
        # under load 9, interleaved)
        runner = self.decoder_with_past
        job = runner.execute_async(inputs, outputs, stream=cache.stream)
        if job.status is not StatusCode.SUCCESS or runner.wait(job) is not StatusCode.SUCCESS:
            raise NpuError(f"the decoder's step failed: {runner.last_error}")
        cache.order = None
        cache.state_rows = rows
        cache.position += 1
        return logits

    def _tensors(self, rows: int, cache: DecoderCache) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """The stateful form's tensors for ``rows`` rows: the prompt's rows (the variables' value after a reset) and
        the cross-attention keys and values as they are, the ids, beam_idx and logits in arrays of the cache's
        own."""
        from ..tensor import NpuTensor
        from ..types import TensorType

        runner = self.decoder_with_past
        ids = np.zeros((rows, 1), np.int64)
        beam = np.zeros(rows, np.int32)
        arrays: dict[str, np.ndarray] = {"input_ids": ids, openvino_state.BEAM_IDX: beam, **cache.cross_kv,
                                         **{openvino_state.SEED + k: v for k, v in cache.self_kv.items()}}
        inputs = [NpuTensor(runner.get_tensor_info_by_name(spec.name, TensorType.CPU).replace(
            shape=arrays[spec.name].shape), arrays[spec.name]) for spec in runner.input_specs]
        info = runner.get_tensor_info_by_name(openvino_state.LOGITS, TensorType.CPU)
        out = runner.allocate_npu_tensor(info.replace(shape=(rows, 1, self._vocab(info))))
        return ids, beam, out.numpy()[:, 0], ([inputs], [[out]])

    def _vocab(self, info: Any) -> int:
        """The logits' last dim: the stateful form's where fixed, else the decoder's."""
        dims = [d for d in (info.shape[-1] if info.shape else None,
                            *(spec.shape[-1] for spec in self.decoder.output_specs if spec.name == "logits")) if d]
        if not dims:
            raise ValueError(f"{self.files.folder}: the decoder's logits have no fixed vocabulary size")
        return int(dims[0])

    def _take_stream(self) -> Any:
        with self._streams_lock:
            stream = self._streams.pop() if self._streams else None
        if stream is None:
            return self.decoder_with_past.open_stream()
        stream.reset()
        return stream

    def release(self, cache: DecoderCache) -> None:
        """The window is decoded: its stream (stateful path) goes back to the pool, its cross-attention arrays to
        the next prompt's run; the cache steps no more (its arrays are no longer its own)."""
        if not cache.stateful or cache.released:
            return
        stream, cache.stream, cache.runs, cache.released = cache.stream, None, None, True
        cross, cache.cross_kv = cache.cross_kv, {}
        with self._streams_lock:
            if self._runners and len(self._cross_free) < _CROSS_KEPT:
                self._cross_free.append(cross)
        if stream is not None:
            with self._streams_lock:
                if self._runners:  # (not closed)
                    self._streams.append(stream)
                    return
            stream.close()

    def describe(self) -> str:
        info = self.encoder.device_info
        return (f"{self.backend} on {info.attached}" + (" (merged decoder)" if self.merged else "")
                + (" (self-attention cache as OpenVINO state)" if self.stateful else "")
                + (f" (self-attention cache static: {self.static_layout.max_length} rows, each step's row written in "
                   "place)" if self.static and self.static_layout else "")
                + (f" (self-attention cache growing: {self.static_refused})" if self.static_refused else "")
                + (f" (self-attention cache fed back: {self.state_refused})" if self.state_refused else ""))

    def close(self) -> None:
        with self._streams_lock:
            streams, self._streams = self._streams, []
            self._cross_free.clear()
        for stream in streams:
            stream.close()
        for runner in reversed(self._runners):
            runner.close()
        self._runners.clear()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None
