"""Audio in: a file (WAV, FLAC, OGG, MP3 and the rest libsndfile reads, through ``soundfile``), its bytes, or samples
with their rate, as the 16 kHz mono float32 signal Whisper hears.

Stereo (any channel count) is mixed down by the mean of the channels, as ffmpeg's ``-ac 1`` does; another rate is
resampled by ``soxr`` (its default high quality). A file's length is read from its header before its samples, so a
file past ``max_seconds`` is refused without being read (bounded memory: a window's decoding needs the whole
signal's features, which grow with it).

Every bad input is a ``AudioError`` (a ValueError) naming what is wrong: no samples, a rate of 0, bytes that are no
audio libsndfile knows, a truncated or damaged file, samples that are not finite.

libsndfile must be loaded before Qualcomm's QNN execution provider: loaded after it (onnxruntime-qnn's HTP emulator
on x86-64 in the process), it crashes the process in its first ``sf_open``. ``load_decoder()`` loads it;
``Transcriber`` calls it before it makes its runners, and a read that would load it after the QNN EP is an
AudioError saying so instead of a crash.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16000  # Whisper's
DEFAULT_MAX_SECONDS = 3600.0  # one hour: the whole signal and its features stay under ~0.4 GB

AudioInput = str | os.PathLike[str] | bytes | bytearray | memoryview | np.ndarray | Any


class AudioError(ValueError):
    """Audio that cannot be transcribed, with why."""


def load(audio: AudioInput, sample_rate: int | None = None, *,
         max_seconds: float | None = DEFAULT_MAX_SECONDS) -> np.ndarray:
    """``audio`` as 16 kHz mono float32 samples: a path, a file's bytes, a binary file object, or samples (a 1-D
    array, or 2-D frames x channels) whose ``sample_rate`` is then required. ``max_seconds`` (None: no cap) refuses
    longer audio before it is decoded."""
    if isinstance(audio, np.ndarray) or (isinstance(audio, (list, tuple)) and audio):
        if sample_rate is None:
            raise AudioError("samples need their sample_rate (e.g. sample_rate=16000)")
        rate = _checked_rate(sample_rate)
        samples = np.asarray(audio)
        if samples.dtype.kind not in "fiu":
            raise AudioError(f"samples must be numbers, got an array of {samples.dtype}")
        if samples.ndim == 2:
            samples = _mixed_down(samples)
        elif samples.ndim != 1:
            raise AudioError(f"samples: a 1-D signal or 2-D (frames, channels), got shape {samples.shape}")
        samples = _as_float(samples)
        _check_length(len(samples), rate, max_seconds, "the samples")
        return _resampled(samples, rate, "the samples")
    if sample_rate is not None:
        raise AudioError("sample_rate is for samples; a file says its own rate")
    if isinstance(audio, (bytes, bytearray, memoryview)):
        if len(audio) == 0:
            raise AudioError("the audio is empty (0 bytes)")
        data = bytes(audio)
        _check_riff(data[:12], len(data), "the audio bytes")
        return _read(io.BytesIO(data), "the audio bytes", max_seconds)
    if isinstance(audio, (str, os.PathLike)):
        path = Path(audio)
        if not path.is_file():
            raise AudioError(f"audio file not found: {path}")
        if path.stat().st_size == 0:
            raise AudioError(f"{path}: the file is empty (0 bytes)")
        with path.open("rb") as head:
            _check_riff(head.read(12), path.stat().st_size, str(path))
        return _read(path, str(path), max_seconds)
    if hasattr(audio, "read"):
        return _read(audio, getattr(audio, "name", "the audio stream"), max_seconds)
    raise AudioError(f"audio: a path, bytes, a binary file or samples, got {type(audio).__name__}")


def load_decoder() -> Any:
    """``soundfile`` with libsndfile loaded (at the latest here; see the module on why before the QNN EP)."""
    import sys

    if "soundfile" not in sys.modules and _qnn_loaded():
        raise AudioError("libsndfile (the audio decoder) cannot be loaded after Qualcomm's QNN execution provider in "
                         "one process: it crashes there. Make the Transcriber, or import npurt.speech.audio and call "
                         "load_decoder(), before any QNN runner; or pass samples with their sample_rate")
    import soundfile  # type: ignore[import-untyped]

    return soundfile


def _qnn_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libonnxruntime_providers_qnn" in line for line in maps)
    except OSError:  # not Linux: nothing to tell
        return False


def _read(source: Any, name: str, max_seconds: float | None) -> np.ndarray:
    soundfile = load_decoder()
    try:
        with soundfile.SoundFile(source) as f:
            rate = f.samplerate
            frames = f.frames
            fmt = f.format
            if rate <= 0:
                raise AudioError(f"{name}: its header gives a sample rate of {rate}")
            _check_length(frames, rate, max_seconds, name)
            data = f.read(dtype="float32", always_2d=True)
    except AudioError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise AudioError(f"{name}: not audio that libsndfile reads (WAV, FLAC, OGG, MP3, ...): {e}") from None
    if len(data) == 0:
        raise AudioError(f"{name}: the audio has 0 samples")
    if frames > 0 and len(data) < frames and fmt != "MP3":  # (an MP3's frame count is an estimate)
        raise AudioError(f"{name}: truncated: its header gives {frames} frames, {len(data)} could be read")
    return _resampled(_as_float(_mixed_down(data)), rate, name)


def _check_riff(head: bytes, size: int, name: str) -> None:
    """A WAV (RIFF / RF64 aside) shorter than its header says is truncated: libsndfile would read what is there
    and say nothing."""
    if len(head) == 12 and head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        declared = int.from_bytes(head[4:8], "little") + 8
        if declared > size:
            raise AudioError(f"{name}: truncated: its RIFF header gives {declared} bytes, the file has {size}")


def _checked_rate(sample_rate: Any) -> int:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise AudioError(f"sample_rate: a positive integer (Hz), got {sample_rate!r}")
    if sample_rate <= 0:
        raise AudioError(f"sample_rate must be positive, got {sample_rate}")
    return int(sample_rate)


def _check_length(frames: int, rate: int, max_seconds: float | None, name: str) -> None:
    if frames == 0:
        raise AudioError(f"{name}: the audio has 0 samples")
    if max_seconds is not None and frames / rate > max_seconds:
        raise AudioError(f"{name}: {frames / rate:.0f} s of audio is past the cap of {max_seconds:.0f} s "
                         f"(max_audio_seconds); cut it into parts")


def _mixed_down(frames: np.ndarray) -> np.ndarray:
    if frames.ndim != 2 or frames.shape[1] == 0:
        raise AudioError(f"samples: (frames, channels) with at least one channel, got shape {frames.shape}")
    if frames.shape[1] == 1:
        return frames[:, 0]
    mixed: np.ndarray = frames.mean(axis=1, dtype=np.float64)
    return mixed


def _as_float(samples: np.ndarray) -> np.ndarray:
    if samples.dtype.kind in "iu":  # integer PCM to [-1, 1), as libsndfile reads it
        scale = float(2 ** (8 * samples.dtype.itemsize - 1))
        offset = scale if samples.dtype.kind == "u" else 0.0
        samples = (samples.astype(np.float64) - offset) / scale
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if not np.isfinite(samples).all():
        raise AudioError("the audio has samples that are not finite (NaN or inf)")
    return samples


def _resampled(samples: np.ndarray, rate: int, name: str) -> np.ndarray:
    if len(samples) == 0:
        raise AudioError(f"{name}: the audio has 0 samples")
    if rate == SAMPLE_RATE:
        return samples
    import soxr  # type: ignore[import-untyped]

    out = soxr.resample(samples, rate, SAMPLE_RATE)
    if len(out) == 0:
        raise AudioError(f"{name}: {len(samples)} samples at {rate} Hz are no sample at {SAMPLE_RATE} Hz")
    return np.ascontiguousarray(out, dtype=np.float32)
