"""Speech with known timing, to check voice-activity detection: phrases spoken by espeak-ng, trimmed and resampled
to 16 kHz mono by sox, laid out between silences of chosen lengths (with a little noise), written as a wav.

Needs the ``espeak-ng`` and ``sox`` programs (Debian/Ubuntu: ``apt-get install espeak-ng sox``). Wav files are read
and written with the standard library's ``wave`` module (16-bit PCM).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
TOOLS = ("espeak-ng", "sox")

PHRASES = ("the quick brown fox jumps over the lazy dog",
           "please send the quarterly report before friday",
           "turn left at the next station",
           "one two three four five")


def missing_tools() -> list[str]:
    """The synthesis programs that are not on PATH."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """A 16-bit PCM wav as float32 samples in [-1, 1] (channels averaged) and its sample rate."""
    with wave.open(os.fspath(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * w.getsampwidth()}-bit samples; only 16-bit PCM is read")
        frames = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
        rate, channels = w.getframerate(), w.getnchannels()
    return frames.reshape(-1, channels).mean(axis=1), rate


def write_wav(path: str | os.PathLike[str], samples: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    with wave.open(os.fspath(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def speak(text: str, voice: str = "en-us", words_per_minute: int = 160) -> np.ndarray:
    """One phrase as 16 kHz mono float32, silence trimmed from both ends."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"speech synthesis needs {' and '.join(missing)} (apt-get install espeak-ng sox)")
    with tempfile.TemporaryDirectory(prefix="npurt-speech-") as tmp:
        raw, trimmed = Path(tmp) / "raw.wav", Path(tmp) / "trimmed.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(raw), text],
                       check=True, capture_output=True, timeout=60)
        # silence ... reverse silence ... reverse: strip quiet samples at the start, then at the end
        subprocess.run(["sox", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(trimmed),
                        "silence", "1", "0.01", "0.5%", "reverse", "silence", "1", "0.01", "0.5%", "reverse"],
                       check=True, capture_output=True, timeout=60)
        samples, rate = read_wav(trimmed)
    assert rate == SAMPLE_RATE
    return samples


def make_speech(path: str | os.PathLike[str], phrases: Sequence[str] = PHRASES,
                gaps_s: Sequence[float] = (0.8, 1.0, 0.6, 1.2, 0.7), seed: int = 0,
                noise: float = 0.002) -> list[tuple[float, float]]:
    """Write a wav of ``gaps_s[0]`` silence, phrase 0, ``gaps_s[1]`` silence, phrase 1, ..., a final silence,
    with Gaussian noise of standard deviation ``noise`` throughout. Returns where each phrase is, in seconds."""
    if len(gaps_s) != len(phrases) + 1:
        raise ValueError(f"{len(phrases)} phrases need {len(phrases) + 1} gaps, got {len(gaps_s)}")
    parts: list[np.ndarray] = []
    truth: list[tuple[float, float]] = []
    at = 0
    for k, gap in enumerate(gaps_s):
        parts.append(np.zeros(int(gap * SAMPLE_RATE), np.float32))
        at += len(parts[-1])
        if k < len(phrases):
            spoken = speak(phrases[k]) * 0.8
            truth.append((at / SAMPLE_RATE, (at + len(spoken)) / SAMPLE_RATE))
            parts.append(spoken)
            at += len(spoken)
    audio = np.concatenate(parts)
    audio += np.random.default_rng(seed).normal(0, noise, audio.shape).astype(np.float32)
    write_wav(path, audio)
    return truth
