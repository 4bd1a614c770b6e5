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

Each window's state (``DecoderCache``) belongs to its caller: one ``WhisperModel`` serves many threads (npurt's
runners are thread-safe). Beam search reorders a cache's rows (``DecoderCache.select``); the cross-attention
keys and values are the same for every row of a window and are never reordered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ENCODER = "encoder_model.onnx"
DECODER = "decoder_model.onnx"
DECODER_WITH_PAST = "decoder_with_past_model.onnx"
DECODER_MERGED = "decoder_model_merged.onnx"

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


@dataclass
class DecoderCache:
    """One window's decoder state for ``rows`` sequences: the self-attention cache (grown a row per step) and the
    cross-attention keys and values (computed once for the window)."""

    self_kv: dict[str, np.ndarray]  # past_key_values.{i}.decoder.{key,value} -> [rows, heads, length, head_dim]
    cross_kv: dict[str, np.ndarray]  # past_key_values.{i}.encoder.{key,value} -> [rows, heads, frames, head_dim]
    hidden: np.ndarray | None  # the encoder's output, where the merged form needs it at every step

    @property
    def rows(self) -> int:
        return int(next(iter(self.self_kv.values())).shape[0])

    @property
    def length(self) -> int:
        return int(next(iter(self.self_kv.values())).shape[2])

    def select(self, rows: Sequence[int] | np.ndarray) -> None:
        """Keep these rows of the self-attention cache, in this order (beam search: each beam's parent)."""
        order = np.asarray(rows, np.int64)
        if order.shape[0] != self.rows:  # the row count changes: the cross-attention rows follow
            self.cross_kv = {k: _rows(v, len(order)) for k, v in self.cross_kv.items()}
        if np.array_equal(order, np.arange(self.rows)):
            return
        self.self_kv = {k: np.ascontiguousarray(v[order]) for k, v in self.self_kv.items()}


def _rows(array: np.ndarray, rows: int) -> np.ndarray:
    """``array``'s first row repeated ``rows`` times (the cross-attention keys of a window are one row's)."""
    return np.ascontiguousarray(np.broadcast_to(array[:1], (rows, *array.shape[1:])))


class WhisperModel:
    """The encoder's and the decoder's runners over one folder, on one backend and device."""

    def __init__(self, folder: str | Path, backend: str = "AUTO", options: Mapping[str, Any] | None = None) -> None:
        from ..factory import RunnerFactory, create_auto

        self.files = WhisperFiles.find(folder)
        opts = dict(options or {})
        name = backend.upper()
        openvino_merged = self.files.decoder_with_past is None
        self._runners: list[Any] = []
        try:
            if name == "AUTO":
                self.encoder, choice = create_auto(self.files.encoder, opts)
                self._runners.append(self.encoder)
                name = choice.backend
            else:
                self.encoder = RunnerFactory.create_runner(name, self.files.encoder, opts)
                self._runners.append(self.encoder)
            self.backend = name
            if self.files.decoder is not None and self.files.decoder_with_past is not None:
                self.decoder = RunnerFactory.create_runner(name, self.files.decoder, opts)
                self._runners.append(self.decoder)
                self.decoder_with_past = RunnerFactory.create_runner(name, self.files.decoder_with_past, opts)
                self._runners.append(self.decoder_with_past)
                self.merged = False
            else:
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
        out = self.decoder.run(feeds)
        cache = DecoderCache({past: out[present] for present, past in self._self_names},
                             {past: out[present] for present, past in self._cross_names},
                             hidden if self.merged else None)
        return out["logits"][0], cache

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
        feeds: dict[str, np.ndarray] = {"input_ids": tokens, **cache.self_kv, **cache.cross_kv}
        if self.merged:
            assert cache.hidden is not None
            feeds["encoder_hidden_states"] = _rows(cache.hidden, cache.rows)
            feeds["use_cache_branch"] = np.ones(1, np.bool_)
        out = self.decoder_with_past.run(feeds)
        cache.self_kv = {past: out[present] for present, past in self._self_names}
        logits: np.ndarray = out["logits"][:, -1]
        return logits

    def describe(self) -> str:
        info = self.encoder.device_info
        return f"{self.backend} on {info.attached}" + (" (merged decoder)" if self.merged else "")

    def close(self) -> None:
        for runner in reversed(self._runners):
            runner.close()
        self._runners.clear()
