"""Speech found with silero-vad (npurt's zoo model ``silero_vad``, 16 kHz), for transcribing only the speech of long
or sparse audio, and for cutting a live stream into utterances.

The model sees 512 new samples (32 ms) a call, after the previous call's last 64, with its state carried (silero-vad
6.x's ``OnnxWrapper``); ``SpeechSegmenter`` turns the probabilities into segments with silero's rules
(``get_speech_timestamps``: a threshold with hysteresis, minimum speech and silence, padding), each decided as soon
as it can be, so that it runs on a live stream (``Utterances``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
STATE_SHAPE = (2, 1, 128)


class SileroVad:
    """One stream of silero-vad over an npurt runner: ``vad(chunk) -> probability`` for each 512-sample chunk."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.takes_sr = any(s.name == "sr" for s in runner.input_specs)
        self.reset()

    @classmethod
    def load(cls, backend: str = "AUTO", options: dict[str, Any] | None = None) -> SileroVad:
        """silero-vad from npurt's model zoo (fetched from its PyPI wheel on first use) on ``backend``: the
        If-less export where OpenVINO runs it (its frontend cannot convert the others)."""
        from ..factory import RunnerFactory
        from ..models import zoo

        name = "silero_vad_op18_ifless" if backend.upper() == "OPENVINO" else "silero_vad"
        return cls(RunnerFactory.create_runner(backend, zoo.path(name), options or {}))

    def reset(self) -> None:
        """A new stream: zero state and context."""
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros((1, CONTEXT), np.float32)

    def __call__(self, chunk: np.ndarray) -> float:
        if chunk.shape != (CHUNK,):
            raise ValueError(f"silero-vad takes chunks of {CHUNK} samples at {SAMPLE_RATE} Hz, got {chunk.shape}")
        x = np.concatenate([self.context, chunk.astype(np.float32, copy=False)[np.newaxis]], axis=1)
        feeds = {"input": x, "state": self.state}
        if self.takes_sr:
            feeds["sr"] = np.array(SAMPLE_RATE, np.int64)
        out = self.runner.run(feeds)
        self.state = np.array(out["stateN"])
        self.context = x[:, -CONTEXT:]
        return float(np.asarray(out["output"]).reshape(-1)[0])

    def close(self) -> None:
        self.runner.close()


class SpeechSegmenter:
    """Speech segments (start, end sample) from per-chunk probabilities, as silero-vad's ``get_speech_timestamps``
    finds them (without its ``max_speech_duration_s`` splitting), but pushed one probability at a time.

    A chunk whose probability reaches ``threshold`` starts speech; speech ends at the first chunk below
    ``neg_threshold`` (default ``threshold - 0.15``) that silence then lasts ``min_silence_ms`` from; segments not
    longer than ``min_speech_ms`` are dropped; kept ones are padded by ``speech_pad_ms`` each side (or meet
    half-way). ``push`` returns the segments decided by that chunk, at most ``2 * speech_pad_ms`` after the silence
    that ended them; ``finish`` the rest."""

    def __init__(self, threshold: float = 0.5, min_speech_ms: float = 250, min_silence_ms: float = 100,
                 speech_pad_ms: float = 30, neg_threshold: float | None = None) -> None:
        self.threshold = threshold
        self.neg_threshold = max(threshold - 0.15, 0.01) if neg_threshold is None else neg_threshold
        self.min_speech = SAMPLE_RATE * min_speech_ms / 1000
        self.min_silence = SAMPLE_RATE * min_silence_ms / 1000
        self.pad = SAMPLE_RATE * speech_pad_ms / 1000
        self.samples = 0
        self._triggered = False
        self._start = 0
        self._temp_end = 0
        self._pending: tuple[int, int] | None = None

    @property
    def idle(self) -> bool:
        """No speech open and none waiting for its end pad: nothing before now can be part of a segment."""
        return not self._triggered and self._pending is None

    def push(self, prob: float) -> list[tuple[int, int]]:
        at, self.samples = self.samples, self.samples + CHUNK
        decided: list[tuple[int, int]] = []
        if prob >= self.threshold and self._temp_end:
            self._temp_end = 0
        if prob >= self.threshold and not self._triggered:
            self._triggered, self._start = True, at
        elif prob < self.neg_threshold and self._triggered:
            if not self._temp_end:
                self._temp_end = at
            if at - self._temp_end >= self.min_silence:
                if self._temp_end - self._start > self.min_speech:
                    decided += self._keep(self._start, self._temp_end)
                self._triggered, self._temp_end = False, 0
        if self._pending is not None and (self._start if self._triggered else at) >= self._pending[1] + 2 * self.pad:
            start, end = self._pending
            decided.append((start, int(end + self.pad)))
            self._pending = None
        return decided

    def finish(self, total_samples: int | None = None) -> list[tuple[int, int]]:
        length = self.samples if total_samples is None else total_samples
        decided: list[tuple[int, int]] = []
        if self._triggered and length - self._start > self.min_speech:
            decided += self._keep(self._start, length)
        if self._pending is not None:
            start, end = self._pending
            decided.append((start, int(min(length, end + self.pad))))
        self._triggered, self._temp_end, self._pending = False, 0, None
        return decided

    def _keep(self, start: int, end: int) -> list[tuple[int, int]]:
        decided: list[tuple[int, int]] = []
        if self._pending is None:
            padded_start = int(max(0, start - self.pad))
        else:
            previous_start, previous_end = self._pending
            gap = start - previous_end
            if gap < 2 * self.pad:
                decided.append((previous_start, previous_end + gap // 2))
                padded_start = int(max(0, start - gap // 2))
            else:
                decided.append((previous_start, int(previous_end + self.pad)))
                padded_start = int(max(0, start - self.pad))
        self._pending = (padded_start, end)
        return decided


def speech_spans(vad: SileroVad, samples: np.ndarray, **segmenter_options: float) -> list[tuple[int, int]]:
    """The speech of a whole 16 kHz signal as (start, end) samples."""
    vad.reset()
    segmenter = SpeechSegmenter(**segmenter_options)
    spans: list[tuple[int, int]] = []
    for at in range(0, len(samples), CHUNK):
        chunk = samples[at:at + CHUNK]
        if len(chunk) < CHUNK:
            chunk = np.pad(chunk, (0, CHUNK - len(chunk)))
        spans += segmenter.push(vad(chunk))
    return spans + segmenter.finish(len(samples))


class Utterances:
    """A live stream cut into utterances: ``push(samples)`` any number of 16 kHz samples as they arrive, get back
    the utterances (sample arrays, with their start in seconds) whose end the VAD has decided; ``finish()`` the
    rest. Keeps only the audio since the oldest utterance not yet returned."""

    def __init__(self, vad: SileroVad, **segmenter_options: float) -> None:
        vad.reset()
        self.vad = vad
        self.segmenter = SpeechSegmenter(**segmenter_options)
        self._pending = np.zeros(0, np.float32)  # samples not yet a whole chunk
        self._kept = np.zeros(0, np.float32)  # audio from sample `_kept_from` on
        self._kept_from = 0

    def push(self, samples: np.ndarray) -> Iterator[tuple[float, np.ndarray]]:
        samples = np.asarray(samples, np.float32).reshape(-1)
        self._kept = np.concatenate([self._kept, samples])
        self._pending = np.concatenate([self._pending, samples])
        while len(self._pending) >= CHUNK:
            chunk, self._pending = self._pending[:CHUNK], self._pending[CHUNK:]
            yield from self._cut(self.segmenter.push(self.vad(chunk)))

    def finish(self) -> Iterator[tuple[float, np.ndarray]]:
        total = self.segmenter.samples + len(self._pending)
        if len(self._pending):
            self.segmenter.push(self.vad(np.pad(self._pending, (0, CHUNK - len(self._pending)))))
            self._pending = np.zeros(0, np.float32)
        yield from self._cut(self.segmenter.finish(total))

    def _cut(self, spans: list[tuple[int, int]]) -> Iterator[tuple[float, np.ndarray]]:
        for start, end in spans:
            piece = self._kept[max(0, start - self._kept_from):max(0, end - self._kept_from)]
            yield start / SAMPLE_RATE, piece.copy()
            # nothing before this end is needed again (a later segment starts after it)
            drop = max(0, end - self._kept_from - int(self.segmenter.pad))
            self._kept, self._kept_from = self._kept[drop:], self._kept_from + drop
        if self.segmenter.idle:
            # no speech open: keep only a padding's worth of the past
            keep = int(self.segmenter.pad) + CHUNK
            if len(self._kept) > keep:
                drop = len(self._kept) - keep
                self._kept, self._kept_from = self._kept[drop:], self._kept_from + drop
