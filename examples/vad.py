"""Streaming voice-activity detection with silero-vad (ONNX, 16 kHz) as plain functions.

The model is stateful and sees audio 512 samples (32 ms) at a time. As silero-vad 6.x's own ``OnnxWrapper``
feeds it, each call gets

    input  [1, 576] float32   the last 64 samples of the previous call's input, then the 512 new samples
    state  [2, 1, 128] float32  the previous call's ``stateN`` (zeros at the start of a stream)
    sr     int64 scalar        16000

and returns ``output`` [1, 1] (the probability that the chunk is speech) and ``stateN``. ``Segmenter`` turns the
probabilities into speech segments with silero's rules (``get_speech_timestamps``: a threshold with hysteresis,
minimum speech and silence durations, padding), emitting each segment as soon as it is decided, so that it runs
on a live stream.

OpenVINO (2026.4) cannot convert ``silero_vad_16k_op15.onnx`` (nor ``silero_vad.onnx``, ``silero_vad_half.onnx``):
its ONNX frontend fails on a Conv and a ReduceMean inside the models' nested ``If`` branches, whose input rank
and type it does not infer. ``silero_vad_op18_ifless.onnx`` has the same ports (and, despite its name, one flat
``If`` that picks the 8 or 16 kHz network), converts, and gives the same probabilities (within 1e-6 on ONNX
Runtime): use it where OpenVINO runs the model.

The model is reached through an "infer" callable (see ``infer.py``): ``npurt.Runner.run``, or ONNX Runtime /
OpenVINO used directly (``ort_infer``, ``ov_infer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from infer import Infer, ort_infer, output, ov_infer
from npurt.speech.vad import SpeechSegmenter

__all__ = ["CHUNK", "CONTEXT", "SAMPLE_RATE", "Segmenter", "SileroVad", "chunks", "ort_infer", "ov_infer",
           "speech_probabilities", "speech_segments", "stream_segments"]

SAMPLE_RATE = 16000
CHUNK = 512  # new samples per call
CONTEXT = 64  # samples of the previous call prepended
STATE_SHAPE = (2, 1, 128)

Segment = tuple[float, float]  # start, end in seconds


class SileroVad:
    """One stream: call it with each 512-sample chunk, in order, to get that chunk's speech probability."""

    def __init__(self, infer: Infer, takes_sr: bool = True) -> None:
        self.infer = infer
        self.takes_sr = takes_sr  # silero_vad_half and silero_vad_openvino_16k have no sr input
        self.reset()

    def reset(self) -> None:
        """Start a new stream: zero state and context."""
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros((1, CONTEXT), np.float32)

    def __call__(self, chunk: np.ndarray) -> float:
        if chunk.shape != (CHUNK,):
            raise ValueError(f"silero-vad takes chunks of {CHUNK} samples at {SAMPLE_RATE} Hz, got {chunk.shape}")
        x = np.concatenate([self.context, chunk.astype(np.float32, copy=False)[np.newaxis]], axis=1)
        feeds = {"input": x, "state": self.state}
        if self.takes_sr:
            feeds["sr"] = np.array(SAMPLE_RATE, np.int64)
        result = self.infer(feeds)
        # kept for the next call: a copy, since an engine may reuse its output's memory (OpenVINO's shared outputs)
        self.state = np.array(output(result, "stateN", 1))
        self.context = x[:, -CONTEXT:]
        return float(output(result, "output", 0).reshape(-1)[0])


def chunks(audio: np.ndarray) -> Iterator[np.ndarray]:
    """512-sample chunks of a signal, the last one padded with zeros."""
    for start in range(0, len(audio), CHUNK):
        chunk = audio[start:start + CHUNK]
        if len(chunk) < CHUNK:
            chunk = np.pad(chunk, (0, CHUNK - len(chunk)))
        yield chunk


class Segmenter(SpeechSegmenter):
    """npurt's silero-vad segmenter (``npurt.speech.vad.SpeechSegmenter``: silero's ``get_speech_timestamps`` rules,
    pushed one probability at a time) with its segments in seconds."""

    def push(self, prob: float) -> list[Segment]:  # type: ignore[override]
        return [_seconds(span) for span in super().push(prob)]

    def finish(self, total_samples: int | None = None) -> list[Segment]:  # type: ignore[override]
        """The segments still open at the end of the stream (``total_samples``: its length before padding)."""
        return [_seconds(span) for span in super().finish(total_samples)]


def _seconds(span: tuple[int, int]) -> Segment:
    return span[0] / SAMPLE_RATE, span[1] / SAMPLE_RATE


def speech_probabilities(infer: Infer, audio: np.ndarray, takes_sr: bool = True) -> np.ndarray:
    """One probability per 512-sample chunk of a 16 kHz signal."""
    vad = SileroVad(infer, takes_sr)
    return np.array([vad(chunk) for chunk in chunks(audio)], np.float32)


def stream_segments(infer: Infer, stream: Iterable[np.ndarray], takes_sr: bool = True,
                    **segmenter_options: float) -> Iterator[Segment]:
    """Speech segments of a stream of chunks of 512 samples (the last may be shorter), each segment yielded as
    soon as it is decided."""
    vad, segmenter = SileroVad(infer, takes_sr), Segmenter(**segmenter_options)
    length = 0
    for chunk in stream:
        length += len(chunk)
        if len(chunk) < CHUNK:
            chunk = np.pad(chunk, (0, CHUNK - len(chunk)))
        yield from segmenter.push(vad(chunk))
    yield from segmenter.finish(length)


def speech_segments(infer: Infer, audio: np.ndarray, takes_sr: bool = True,
                    **segmenter_options: float) -> list[Segment]:
    """Speech segments of a whole 16 kHz signal, in seconds."""
    vad, segmenter = SileroVad(infer, takes_sr), Segmenter(**segmenter_options)
    segments = [segment for chunk in chunks(audio) for segment in segmenter.push(vad(chunk))]
    return segments + segmenter.finish(len(audio))
