"""Whisper's log-mel features in numpy, as transformers' ``WhisperFeatureExtractor`` computes them (within 1e-5).

A periodic Hann window of ``n_fft`` (400) samples every ``hop_length`` (160), the signal reflect-padded by half a
window each side (``center=True``), the power spectrum through a Slaney-scale, Slaney-normalised mel filter bank
(0 to 8 kHz), ``log10`` clamped at 1e-10, the last frame dropped, floored at 8 below the maximum, then
``(x + 4) / 4``. Computed in float64 and returned as float32.

The mel filters are applied band by band (``mel_bands``: each filter's run of bins), not through a matrix product:
numpy's OpenBLAS runs a product of this size on all its threads, which then spin waiting for the next one while the
encoder runs right after on the same cores (measured on the 2-core VM: the OPENVINO encoder 323 against 290 ms a
window with OPENBLAS_NUM_THREADS=1, beside OpenVINO GenAI's). The same sums in another order: float64 within 1e-15,
the float32 features equal.

``log_mel(samples)`` pads (zeros) or trims the signal to ``n_samples`` (30 s) first, as the extractor does by
default; ``log_mel(samples, pad=False)`` is the long-audio form (``padding="longest"``, ``truncation=False``: the
signal padded to 30 s only where it is shorter), whose windows ``window`` cuts out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FeatureSettings:
    """``preprocessor_config.json``'s numbers (the defaults are Whisper's)."""

    feature_size: int = 80  # mel bins (128 for large-v3)
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    chunk_length: int = 30  # seconds per window
    padding_value: float = 0.0

    @property
    def n_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    @property
    def nb_max_frames(self) -> int:
        return self.n_samples // self.hop_length

    @property
    def seconds_per_frame(self) -> float:
        return self.hop_length / self.sampling_rate

    @classmethod
    def read(cls, folder: Path) -> FeatureSettings:
        """From ``preprocessor_config.json`` in ``folder``; the defaults where it is not there."""
        import json

        path = folder / "preprocessor_config.json"
        if not path.exists():
            return cls()
        try:
            config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not readable JSON: {e}") from None
        if config.get("feature_extractor_type", "WhisperFeatureExtractor") != "WhisperFeatureExtractor":
            raise ValueError(f"{path}: feature_extractor_type {config['feature_extractor_type']!r}; npurt computes "
                             f"WhisperFeatureExtractor's features")
        names = ("feature_size", "sampling_rate", "hop_length", "n_fft", "chunk_length")
        settings = cls(**{n: int(config[n]) for n in names if n in config},
                       padding_value=float(config.get("padding_value", 0.0)))
        if float(config.get("dither", 0.0)) != 0.0:
            raise ValueError(f"{path}: dither {config['dither']}: npurt's features are deterministic (dither 0)")
        return settings


@lru_cache(maxsize=4)
def mel_filters(num_frequency_bins: int, num_mel_filters: int, sampling_rate: int,
                min_frequency: float = 0.0, max_frequency: float = 8000.0) -> np.ndarray:
    """transformers' ``mel_filter_bank(..., norm="slaney", mel_scale="slaney")``: [frequency bins, mel filters]."""

    def hz_to_mel(hz: np.ndarray) -> np.ndarray:
        mels = 3.0 * hz / 200.0
        log_region = hz >= 1000.0
        return np.where(log_region, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * (27.0 / np.log(6.4)), mels)

    def mel_to_hz(mels: np.ndarray) -> np.ndarray:
        hz = 200.0 * mels / 3.0
        log_region = mels >= 15.0
        return np.where(log_region, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels - 15.0)), hz)

    mel_min, mel_max = hz_to_mel(np.array([min_frequency, max_frequency], np.float64))
    filter_freqs = mel_to_hz(np.linspace(mel_min, mel_max, num_mel_filters + 2))
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    filter_diff = np.diff(filter_freqs)
    slopes = filter_freqs[np.newaxis, :] - fft_freqs[:, np.newaxis]
    down = -slopes[:, :-2] / filter_diff[:-1]
    up = slopes[:, 2:] / filter_diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    enorm = 2.0 / (filter_freqs[2:num_mel_filters + 2] - filter_freqs[:num_mel_filters])
    filters = filters * enorm[np.newaxis, :]
    filters.setflags(write=False)
    out: np.ndarray = filters
    return out


@lru_cache(maxsize=4)
def mel_bands(num_frequency_bins: int, num_mel_filters: int, sampling_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """``mel_filters`` as bands: (bins, weights), each [width, mel filters]: row k holds each filter's k-th bin of
    its run from its first to its last nonzero weight (a narrower filter's rows past its run: bin 0, weight 0)."""
    filters = mel_filters(num_frequency_bins, num_mel_filters, sampling_rate)
    nonzero = filters != 0
    first = np.where(nonzero.any(axis=0), nonzero.argmax(axis=0), 0)
    last = np.where(nonzero.any(axis=0), num_frequency_bins - 1 - nonzero[::-1].argmax(axis=0), -1)
    widths = last - first + 1
    rows = np.arange(max(1, int(widths.max())))[:, None]
    inside = rows < widths[None, :]
    bins = np.where(inside, first[None, :] + rows, 0)
    weights = np.where(inside, filters[bins, np.arange(num_mel_filters)[None, :]], 0.0)
    bins.setflags(write=False)
    weights.setflags(write=False)
    return bins, weights


def log_mel(samples: np.ndarray, settings: FeatureSettings = FeatureSettings(), *, pad: bool = True) -> np.ndarray:
    """float32 [feature_size, frames] of 16 kHz mono ``samples``: 3000 frames (30 s) with ``pad``; without it,
    ``len(samples) // hop_length`` frames (at least 3000)."""
    signal = np.asarray(samples, np.float64).reshape(-1)
    n = settings.n_samples
    if pad:
        signal = signal[:n]
    heard = len(signal)  # samples before the padding
    n_fft, hop = settings.n_fft, settings.hop_length
    total = max(n, heard)  # the signal's samples once padded to n
    count = 1 + (total + 2 * (n_fft // 2) - n_fft) // hop
    # Frames that start past the audio and its reflection hold only zero padding: their power is exactly 0, so
    # they are left at 0 instead of transformed (most of a short utterance's 30 s window)
    reached = count if settings.padding_value != 0.0 else min(count, (heard + n_fft // 2 + hop - 1) // hop)
    # the padded signal as far as those frames read it (their samples of the zero padding made, not the whole 30 s:
    # the same prefix of the reflect-padded signal where they end before the signal's padded end)
    length = (reached - 1) * hop + n_fft
    if reached < count and length <= total:
        signal = np.concatenate([signal[:length], np.zeros(length - min(heard, length))])
    elif heard < n:
        signal = np.concatenate([signal, np.full(n - heard, settings.padding_value)])
    padded = np.pad(signal, n_fft // 2, mode="reflect")
    window = np.hanning(n_fft + 1)[:-1]  # periodic
    rows = 1 + (len(padded) - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(padded, (rows, n_fft), (padded.strides[0] * hop, padded.strides[0]),
                                             writeable=False)
    bins, weights = mel_bands(1 + n_fft // 2, settings.feature_size, settings.sampling_rate)
    mel = np.zeros((settings.feature_size, count), np.float64)
    block = 4096  # frames per FFT: bounded scratch memory for long audio
    for at in range(0, reached, block):
        upto = min(at + block, reached)
        spectrum = np.fft.rfft(frames[at:upto] * window, axis=1)
        power = np.ascontiguousarray((spectrum.real ** 2 + spectrum.imag ** 2).T)  # [bins, frames]
        band = mel[:, at:upto]
        for k in range(bins.shape[0]):  # (the filters over the power, bin by bin of each band: no BLAS)
            band += power[bins[k]] * weights[k][:, None]
    log_spec = np.log10(np.maximum(mel[:, :-1], 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    out: np.ndarray = ((log_spec + 4.0) / 4.0).astype(np.float32)
    return out


def window(features: np.ndarray, start: int, frames: int) -> np.ndarray:
    """``frames`` frames of long-form ``features`` from ``start``, padded with zeros past their end (as
    transformers pads a window's features), float32 [1, feature_size, frames] for the encoder."""
    cut = features[:, start:start + frames]
    out = np.zeros((1, features.shape[0], frames), np.float32)
    out[0, :, :cut.shape[1]] = cut
    return out
