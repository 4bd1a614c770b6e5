"""Audio of any length as 30-s windows, each starting where the last one's speech ended, as transformers'
``WhisperGenerationMixin.generate`` (4.57) walks long-form audio (and openai-whisper's ``transcribe`` does likewise).

The features are computed once over the whole signal (``features.log_mel(pad=False)``); a window is the 3000 frames
from ``seek`` (zero-padded past the end). Its decoded ids are cut into segments at each pair of consecutive
timestamps (``cut_segments``: transformers' ``_retrieve_segment``); the next window starts at the last closed pair's
timestamp, or after this window where the ids end on a single timestamp (the speech ran on to its end) or hold
none. Without timestamps a window is one segment and the next starts 30 s on.

Each window's decoding falls back to the next temperature where its text compresses too well (repetition) or its
mean log-probability is too low, as openai-whisper and faster-whisper do; a window whose ``<|nospeech|>``
probability is high and whose text is unsure is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from . import features as feats
from .decoding import DecodeSettings, WindowResult, compression_ratio, decode_window
from .model import WhisperModel
from .tokens import SECONDS_PER_TIMESTAMP, SpecialTokens

INPUT_STRIDE = 2  # feature frames per encoder position (a timestamp step is 2 frames)


@dataclass(frozen=True)
class Segment:
    """A stretch of speech: its start and end in seconds, its text, and its ids (timestamps included)."""

    start: float
    end: float
    text: str
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Fallback:
    """The temperatures tried in turn, and when a window's result is not kept (None: never on that ground)."""

    temperatures: tuple[float, ...] = (0.0,)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6

    def needs_fallback(self, result: WindowResult, text: str) -> bool:
        if self.compression_ratio_threshold is not None and \
                compression_ratio(text) > self.compression_ratio_threshold:
            return True
        return self.logprob_threshold is not None and result.avg_logprob < self.logprob_threshold

    def is_silence(self, result: WindowResult) -> bool:
        return (self.no_speech_threshold is not None and result.no_speech_prob > self.no_speech_threshold
                and self.logprob_threshold is not None and result.avg_logprob < self.logprob_threshold)


def cut_segments(ids: Sequence[int], time_offset: float, window_frames: int, tokens: SpecialTokens,
                 text_of: Callable[[Sequence[int]], str]) -> tuple[list[Segment], int]:
    """A window's ids as segments, and how many frames the next window starts after this one's start."""
    begin = tokens.timestamp_begin
    is_stamp = [t >= begin for t in ids]
    single_ending = is_stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(ids) - 1) if is_stamp[i] and is_stamp[i + 1]]
    if cuts:
        if single_ending:
            cuts.append(len(ids))
        else:
            cuts[-1] += 1
        segments = []
        last = 0
        for n, cut in enumerate(cuts):
            piece = ids[last:cut]
            end_at = -1 if n < len(cuts) - 1 or single_ending else -2
            segments.append(Segment(_seconds(time_offset, piece[0] - begin),
                                    _seconds(time_offset, piece[end_at] - begin), text_of(piece), tuple(piece)))
            last = cut
        offset = window_frames if single_ending else (ids[last - 2] - begin) * INPUT_STRIDE
        return segments, offset
    stamps = [t for t in ids if t >= begin]
    end_pos = float(int(window_frames * 0.01 / SECONDS_PER_TIMESTAMP))
    if stamps and stamps[-1] != begin:
        end_pos = float(stamps[-1] - begin)
    return [Segment(time_offset, _seconds(time_offset, end_pos), text_of(ids), tuple(ids))], window_frames


def _seconds(offset: float, position: float) -> float:
    return float(offset + float(position) * SECONDS_PER_TIMESTAMP)


@dataclass(frozen=True)
class WindowRequest:
    """What every window of one transcription shares."""

    language: str | None
    task: str
    settings: DecodeSettings
    fallback: Fallback
    initial_prompt: Sequence[int] = ()
    condition_on_previous_text: bool = False
    seed: int | None = None


def transcribe_windows(model: WhisperModel, tokens: SpecialTokens, features: np.ndarray, request: WindowRequest,
                       text_of: Callable[[Sequence[int]], str], time_offset: float = 0.0,
                       on_token: Callable[[int], None] | None = None,
                       content_frames: int | None = None) -> Iterator[Segment]:
    """The segments of long-form ``features`` [n_mels, frames], window by window (``time_offset``: seconds added to
    every timestamp, for a piece cut from a longer signal). ``content_frames``: the frames of audio there is (the
    features of a clip under 30 s are padded to 3000); the windows end there."""
    window_frames = model.frames
    max_frames = features.shape[1] if content_frames is None else min(content_frames, features.shape[1])
    seek = 0
    previous: list[int] = []
    rng = np.random.default_rng(request.seed)
    while seek < max_frames:
        offset = time_offset + seek * SECONDS_PER_TIMESTAMP / INPUT_STRIDE
        frames = min(max_frames - seek, window_frames)
        hidden = model.encode(feats.window(features, seek, window_frames))
        context = [*request.initial_prompt, *(previous if request.condition_on_previous_text else [])]
        prompt = tokens.prompt(request.language, request.task, request.settings.timestamps, context)
        result = _decode_with_fallback(model, hidden, prompt, tokens, request, text_of, rng, on_token)
        if result is None:  # silence
            seek += frames
            continue
        if not result.tokens:
            seek += frames
            continue
        segments, advance = cut_segments(result.tokens, offset, frames, tokens, text_of)
        yield from segments
        if result.temperature < 0.5:
            previous += [t for t in result.tokens if t < tokens.eot]
        seek += max(1, advance)


def _decode_with_fallback(model: WhisperModel, hidden: np.ndarray, prompt: Sequence[int], tokens: SpecialTokens,
                          request: WindowRequest, text_of: Callable[[Sequence[int]], str], rng: np.random.Generator,
                          on_token: Callable[[int], None] | None) -> WindowResult | None:
    temperatures = request.fallback.temperatures
    result: WindowResult | None = None
    for n, temperature in enumerate(temperatures):
        result = decode_window(model, hidden, prompt, tokens, request.settings, temperature, rng,
                               on_token if n == 0 else None)
        if len(temperatures) == 1:
            return result
        if request.fallback.is_silence(result):
            return None
        if not request.fallback.needs_fallback(result, text_of([t for t in result.tokens if t < tokens.eot])):
            return result
    return result
