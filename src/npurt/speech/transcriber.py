"""``npurt.Transcriber(folder)``: speech to text with a Whisper export on any npurt backend.

``transcribe(audio)`` takes a path, a file's bytes, a binary file or samples with their rate, and returns a
``Transcription``: the text, the segments (start, end, text, ids) and every id decoded. ``stream(audio)`` yields the
segments as each window is decoded (a server streams them); ``on_text`` sees the text in pieces as it is decoded
(token by token where the decode is greedy without fallback, else a segment at a time: the pieces joined are
``Transcription.text``), ``on_token`` each id of a greedy decode as it is chosen.

Thread-safe: one Transcriber serves many threads at once (each call keeps its own decoder state; the runners are
shared). Defaults are transformers' ``generate``: greedy, no fallback, no timestamps; ``temperature`` as a tuple
turns on openai-whisper's fallback (``Fallback``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import audio as audio_in
from . import features as feats
from . import tokens as special
from .decoding import DecodeSettings
from .model import WhisperModel
from .windows import Fallback, Segment, WindowRequest, transcribe_windows

DEFAULT_FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # openai-whisper's and faster-whisper's temperatures


@dataclass(frozen=True)
class Transcription:
    """What was said: ``text``, its ``segments`` and every id decoded (``ids``: the segments' ids in order)."""

    text: str
    segments: tuple[Segment, ...]
    language: str | None
    duration: float  # seconds of audio
    ids: tuple[int, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "language": self.language, "duration": self.duration, "ids": list(self.ids),
                "segments": [{"start": s.start, "end": s.end, "text": s.text, "ids": list(s.ids)}
                             for s in self.segments]}


class Transcriber:
    """A Whisper folder (optimum's export: ``encoder_model.onnx``, ``decoder_model.onnx`` and
    ``decoder_with_past_model.onnx`` or ``decoder_model_merged.onnx``, with ``config.json``,
    ``generation_config.json``, ``preprocessor_config.json`` and ``tokenizer.json``) on ``backend`` and ``device``.

    ``options``: the runners' options (``npurt`` runner options; ``device`` is set from the argument).
    ``max_audio_seconds``: longer audio is refused before it is decoded (None: no cap).
    ``stateful``: on OPENVINO, the decoder's self-attention cache kept inside the plug-in as OpenVINO state (None:
    on its CPU; False: fed back every step, as on the other backends and devices; see ``speech.model``).
    ``static_cache``: the decoder's self-attention cache at a fixed ``max_target_positions`` rows, each step's row
    written in place (None: where the runners' shapes are pinned: backend QNN, device NPU, or option
    ``static_shapes`` True; True: on any backend; False: never; see ``speech.static_cache``).
    ValueError for a folder that is not such an export; NpuError where an engine cannot load it."""

    def __init__(self, folder: str | os.PathLike[str], backend: str = "AUTO", device: str = "AUTO",
                 options: Mapping[str, Any] | None = None, *,
                 max_audio_seconds: float | None = audio_in.DEFAULT_MAX_SECONDS, stateful: bool | None = None,
                 static_cache: bool | None = None) -> None:
        from ..text import Tokenizer

        self.folder = Path(folder)
        self.max_audio_seconds = max_audio_seconds
        audio_in.load_decoder()  # before the runners: libsndfile loaded after the QNN EP crashes (see audio)
        self.feature_settings = feats.FeatureSettings.read(self.folder) if self.folder.is_dir() else \
            feats.FeatureSettings()
        self.model = WhisperModel(self.folder, backend, {**(options or {}), "device": device}, stateful=stateful,
                                  static_cache=static_cache)
        try:
            self.tokenizer = Tokenizer(self.folder)
            self.tokens = special.read(self.folder, self.tokenizer.convert_tokens_to_ids)
            if self.model.n_mels != self.feature_settings.feature_size:
                raise ValueError(f"{self.folder}: the encoder takes {self.model.n_mels} mel bins, "
                                 f"preprocessor_config.json gives {self.feature_settings.feature_size}")
        except BaseException:
            self.model.close()
            raise
        self._vad: Any = None
        self._vad_lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self.model.backend

    @property
    def multilingual(self) -> bool:
        return self.tokens.multilingual

    def text_of(self, ids: Sequence[int]) -> str:
        """The text of ``ids``: their text tokens, decoded (timestamps and special tokens left out)."""
        return self.tokenizer.decode([t for t in ids if t < self.tokens.eot])

    def features(self, audio: audio_in.AudioInput, sample_rate: int | None = None) -> np.ndarray:
        """The log-mel features of ``audio`` [n_mels, frames] as transcribe computes them: 3000 frames where it is
        30 s or less, ``len // hop_length`` frames where it is longer."""
        samples = audio_in.load(audio, sample_rate, max_seconds=self.max_audio_seconds)
        return feats.log_mel(samples, self.feature_settings, pad=False)

    def detect_language(self, audio: audio_in.AudioInput, sample_rate: int | None = None) -> tuple[str, float]:
        """The language of the first 30 s and its probability (multilingual models only)."""
        samples = audio_in.load(audio, sample_rate, max_seconds=self.max_audio_seconds)
        return self._detect(feats.log_mel(samples, self.feature_settings, pad=False))

    def _detect(self, features: np.ndarray) -> tuple[str, float]:
        if not self.tokens.multilingual:
            raise ValueError("this model is English-only: it has no language to detect")
        hidden = self.model.encode(feats.window(features, 0, self.model.frames))
        logits, _ = self.model.prefill(hidden, [self.tokens.sot])
        row = logits[-1].astype(np.float64)
        ids = np.array(list(self.tokens.languages.values()))
        scores = row[ids]
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        best = int(np.argmax(probs))
        return list(self.tokens.languages)[best], float(probs[best])

    def transcribe(self, audio: audio_in.AudioInput, *, sample_rate: int | None = None, language: str | None = None,
                   task: str = "transcribe", beam_size: int = 1, temperature: float | Sequence[float] = 0.0,
                   timestamps: bool = False, initial_prompt: str | None = None, vad: bool = False,
                   condition_on_previous_text: bool = False, max_new_tokens: int | None = None,
                   seed: int | None = None,
                   on_segment: Callable[[Segment], None] | None = None,
                   on_token: Callable[[int], None] | None = None,
                   on_text: Callable[[str], None] | None = None) -> Transcription:
        """Transcribe (or, ``task="translate"``, translate to English) ``audio``.

        ``language``: its code or name (multilingual models; detected where None). ``beam_size`` > 1: beam search.
        ``temperature``: 0 greedy; a tuple: tried in turn where a window's text compresses past 2.4 or its mean
        log-probability is below -1 (openai-whisper's fallback; ``DEFAULT_FALLBACK`` is its list).
        ``timestamps``: segments cut at the model's timestamps. ``initial_prompt``: text the model takes as what
        came before (spelling, names). ``vad``: only the speech silero-vad finds is transcribed, each stretch
        on its own. ``on_segment`` sees each segment as it is decided, ``on_token`` each id of a greedy decode
        (with a fallback, the first temperature's only), ``on_text`` the text in pieces (see the module).
        AudioError (a ValueError) for audio that cannot be read; ValueError for bad settings."""
        segments: list[Segment] = []
        prepared = self._prepare(audio, sample_rate, language, task, beam_size, temperature, timestamps,
                                 initial_prompt, vad, condition_on_previous_text, max_new_tokens, seed)
        for segment in self._segments(prepared, on_token, on_text):
            segments.append(segment)
            if on_segment is not None:
                on_segment(segment)
        ids = tuple(t for s in segments for t in s.ids)
        return Transcription(self.text_of(ids), tuple(segments), prepared.request.language, prepared.duration, ids)

    def stream(self, audio: audio_in.AudioInput, **settings: Any) -> Iterator[Segment]:
        """``transcribe``'s segments, each as soon as its window is decoded (the same keyword arguments, but
        ``on_segment``). Bad audio and settings raise before the first segment is yielded."""
        token_hook = settings.pop("on_token", None)
        text_hook = settings.pop("on_text", None)
        sample_rate = settings.pop("sample_rate", None)
        prepared = self._prepare(audio, sample_rate, settings.pop("language", None),
                                 settings.pop("task", "transcribe"), settings.pop("beam_size", 1),
                                 settings.pop("temperature", 0.0), settings.pop("timestamps", False),
                                 settings.pop("initial_prompt", None), settings.pop("vad", False),
                                 settings.pop("condition_on_previous_text", False),
                                 settings.pop("max_new_tokens", None), settings.pop("seed", None))
        if settings:
            raise TypeError(f"stream() got unexpected keyword arguments: {', '.join(sorted(settings))}")
        return self._segments(prepared, token_hook, text_hook)

    # ------------------------------------------------------------------------------------------------ internals
    def _prepare(self, audio: audio_in.AudioInput, sample_rate: int | None, language: str | None, task: str,
                 beam_size: int, temperature: float | Sequence[float], timestamps: bool,
                 initial_prompt: str | None, vad: bool, condition: bool, max_new_tokens: int | None,
                 seed: int | None) -> _Prepared:
        if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
            raise ValueError(f"beam_size: a positive integer, got {beam_size!r}")
        temperatures = (float(temperature),) if isinstance(temperature, (int, float)) else \
            tuple(float(t) for t in temperature)
        if not temperatures or any(not 0 <= t <= 2 for t in temperatures):
            raise ValueError(f"temperature: a value in 0 .. 2 or a sequence of them, got {temperature!r}")
        if task not in special.TASKS:
            raise ValueError(f"task: 'transcribe' or 'translate', got {task!r}")
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                           or max_new_tokens < 1):
            raise ValueError(f"max_new_tokens: a positive integer, got {max_new_tokens!r}")
        if not self.tokens.multilingual:
            self.tokens.sot_sequence(language, task)  # (raises for a language or task an English model lacks)
        elif language is not None:
            self.tokens.language_id(language)
        prompt_ids: list[int] = []
        if initial_prompt:
            prompt_ids = self.tokenizer.encode(" " + initial_prompt.strip(), add_special_tokens=False)
        samples = audio_in.load(audio, sample_rate, max_seconds=self.max_audio_seconds)
        duration = len(samples) / audio_in.SAMPLE_RATE
        request = WindowRequest(
            language=None if not self.tokens.multilingual else language, task=task,
            settings=DecodeSettings(beam_size=beam_size, timestamps=timestamps, max_new_tokens=max_new_tokens),
            fallback=Fallback(temperatures) if len(temperatures) > 1 else Fallback(temperatures, None, None, None),
            initial_prompt=tuple(prompt_ids), condition_on_previous_text=condition, seed=seed)
        return _Prepared(samples, duration, request, vad)

    def _segments(self, prepared: _Prepared, on_token: Callable[[int], None] | None,
                  on_text: Callable[[str], None] | None) -> Iterator[Segment]:
        from ..text import DecodeStream

        request = prepared.request
        eot = self.tokens.eot
        text = DecodeStream(self.tokenizer) if on_text is not None else None
        # token by token where every id chosen stays (greedy, one temperature); else a segment at a time
        live = text is not None and len(request.fallback.temperatures) == 1 and request.settings.beam_size == 1

        def hook(token: int) -> None:
            if on_token is not None:
                on_token(token)
            if live and token < eot and text is not None and on_text is not None and (piece := text.step(token)):
                on_text(piece)

        for segment in self._spans(prepared, hook if on_token is not None or live else None):
            if text is not None and on_text is not None and not live and \
                    (piece := text.step_many([t for t in segment.ids if t < eot])):
                on_text(piece)
            yield segment
        if text is not None and on_text is not None and (rest := text.flush()):
            on_text(rest)

    def _spans(self, prepared: _Prepared, on_token: Callable[[int], None] | None) -> Iterator[Segment]:
        request = prepared.request
        if prepared.vad:
            spans = self._speech(prepared.samples)
        else:
            spans = [(0, len(prepared.samples))]
        for start, end in spans:
            features = feats.log_mel(prepared.samples[start:end], self.feature_settings, pad=False)
            if self.tokens.multilingual and request.language is None:
                language, _ = self._detect(features)
                request = _with_language(request, language)
                prepared.request = request
            # the audio's own frames: a clip under 30 s ends where it ends (openai-whisper), where transformers
            # decodes on into the padding (and ends a segment without timestamps at 30 s); past 30 s the two agree
            frames = max(1, (end - start) // self.feature_settings.hop_length)
            yield from transcribe_windows(self.model, self.tokens, features, request, self.text_of,
                                          start / audio_in.SAMPLE_RATE, on_token, frames)

    def _speech(self, samples: np.ndarray) -> list[tuple[int, int]]:
        from . import vad as silero

        with self._vad_lock:  # one VAD stream: its state is carried chunk to chunk
            if self._vad is None:
                self._vad = silero.SileroVad.load(self.model.backend if self.model.backend != "VAIML" else
                                                  "ONNXRUNTIME")
            return silero.speech_spans(self._vad, samples)

    def close(self) -> None:
        """Release the runners; idempotent."""
        self.model.close()
        if self._vad is not None:
            self._vad.close()
            self._vad = None

    def __enter__(self) -> Transcriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Prepared:
    samples: np.ndarray
    duration: float
    request: WindowRequest
    vad: bool


def _with_language(request: WindowRequest, language: str) -> WindowRequest:
    from dataclasses import replace

    return replace(request, language=language)
