"""npurt.speech's audio in (soundfile + soxr) and log-mel features (against transformers' WhisperFeatureExtractor):
no model needed."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest

from npurt.speech import AudioError
from npurt.speech import audio as audio_in
from npurt.speech.features import FeatureSettings, log_mel, window

sf = pytest.importorskip("soundfile")


def _tone(seconds: float, rate: int = 16000, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _encoded(samples: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


@pytest.mark.parametrize(("fmt", "subtype", "tolerance"), [
    ("WAV", "PCM_16", 1e-4), ("FLAC", "PCM_16", 1e-4), ("OGG", "VORBIS", 0.05), ("MP3", "MPEG_LAYER_III", 0.1)])
def test_formats_decode_to_the_signal(fmt: str, subtype: str, tolerance: float) -> None:
    tone = _tone(1.0)
    got = audio_in.load(_encoded(tone, 16000, fmt, subtype))
    assert got.dtype == np.float32
    assert abs(len(got) - len(tone)) <= 2048  # (MP3's encoder delay and padding)
    n = min(len(got), len(tone))
    if fmt in ("WAV", "FLAC"):
        np.testing.assert_allclose(got[:n], tone[:n], atol=tolerance)
    else:  # lossy: the same energy at the same pitch
        assert abs(np.sqrt(np.mean(got ** 2)) - np.sqrt(np.mean(tone ** 2))) < tolerance
        spectrum = np.abs(np.fft.rfft(got[:16000] if len(got) >= 16000 else np.pad(got, (0, 16000 - len(got)))))
        assert abs(int(np.argmax(spectrum)) - 440) <= 2


def test_stereo_is_mixed_down_and_other_rates_resampled(tmp_path: Path) -> None:
    left, right = _tone(2.0, 44100, 300), _tone(2.0, 44100, 300) * 0.5
    path = tmp_path / "stereo.flac"
    sf.write(path, np.stack([left, right], axis=1), 44100, subtype="PCM_24")
    got = audio_in.load(path)
    assert abs(len(got) - 32000) <= 1
    expected = _tone(2.0, 16000, 300) * 0.75
    np.testing.assert_allclose(got[1000:31000], expected[1000:31000], atol=2e-3)
    # samples with their rate: the same path through soxr
    again = audio_in.load(np.stack([left, right], axis=1), 44100)
    np.testing.assert_allclose(again, got, atol=1e-4)
    # int16 samples scale as libsndfile reads them
    np.testing.assert_allclose(audio_in.load(np.array([16384, -32768], np.int16), 16000), [0.5, -1.0])


@pytest.mark.parametrize(("audio", "rate", "message"), [
    (b"", None, "empty"),
    (b"this is not audio at all, just some bytes" * 20, None, "not audio that libsndfile reads"),
    (np.zeros(0, np.float32), 16000, "0 samples"),
    (np.zeros(100, np.float32), 0, "sample_rate must be positive"),
    (np.zeros(100, np.float32), None, "need their sample_rate"),
    (np.array([0.0, np.nan], np.float32), 16000, "not finite"),
    (np.zeros((2, 2, 2), np.float32), 16000, "1-D signal or 2-D"),
    (12345, None, "a path, bytes"),
])
def test_bad_audio_is_a_clear_error(audio: object, rate: int | None, message: str) -> None:
    with pytest.raises(AudioError, match=message):
        audio_in.load(audio, rate)


def test_missing_empty_and_truncated_files(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="not found"):
        audio_in.load(tmp_path / "nothing.wav")
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        audio_in.load(tmp_path / "empty.wav")
    whole = _encoded(_tone(1.0), 16000, "WAV", "PCM_16")
    (tmp_path / "cut.wav").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(AudioError, match="truncated"):
        audio_in.load(tmp_path / "cut.wav")
    # a WAV header with no frames
    with wave.open(str(tmp_path / "none.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
    with pytest.raises(AudioError, match="0 samples"):
        audio_in.load(tmp_path / "none.wav")


def test_two_hours_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "two_hours.flac"  # silence compresses to a few hundred kB
    with sf.SoundFile(path, "w", 8000, 1, subtype="PCM_16") as f:
        block = np.zeros(8000 * 60, np.int16)
        for _ in range(120):
            f.write(block)
    with pytest.raises(AudioError, match=r"7200 s of audio is past the cap of 3600 s"):
        audio_in.load(path)
    assert len(audio_in.load(path, max_seconds=None)) == 2 * 3600 * 16000  # uncapped: read (at 16 kHz)


# ------------------------------------------------------------------------------------------------ features
def _reference_extractor() -> object:
    transformers = pytest.importorskip("transformers")
    return transformers.WhisperFeatureExtractor(feature_size=80)


def test_features_match_whisper_feature_extractor() -> None:
    extractor = _reference_extractor()
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 7) / 16000
    speechlike = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.05 * rng.standard_normal(len(t)))
    for samples in (speechlike.astype(np.float32), _tone(30.0), (0.2 * rng.standard_normal(16000 * 35))
                    .astype(np.float32)):
        expected = extractor(samples, sampling_rate=16000, return_tensors="np").input_features[0]  # type: ignore
        got = log_mel(samples)
        assert got.shape == expected.shape == (80, 3000)
        assert float(np.max(np.abs(got - expected))) < 1e-5


def test_long_form_features_match_padding_longest() -> None:
    extractor = _reference_extractor()
    samples = (0.2 * np.random.default_rng(1).standard_normal(16000 * 47)).astype(np.float32)
    expected = extractor(samples, sampling_rate=16000, return_tensors="np", truncation=False,  # type: ignore
                         padding="longest").input_features[0]
    got = log_mel(samples, pad=False)
    assert got.shape == expected.shape == (80, 4700)
    assert float(np.max(np.abs(got - expected))) < 1e-5
    last = window(got, 3000, 3000)
    assert last.shape == (1, 80, 3000)
    np.testing.assert_array_equal(last[0, :, :1700], got[:, 3000:])
    assert not last[0, :, 1700:].any()  # padded with zeros, as transformers pads a window


def test_feature_settings_from_the_folder(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text('{"feature_size": 128, "hop_length": 160, "n_fft": 400, '
                                                       '"sampling_rate": 16000, "chunk_length": 30}')
    settings = FeatureSettings.read(tmp_path)
    assert settings.feature_size == 128
    assert log_mel(_tone(1.0), settings).shape == (128, 3000)
    (tmp_path / "preprocessor_config.json").write_text('{"feature_extractor_type": "Wav2Vec2FeatureExtractor"}')
    with pytest.raises(ValueError, match="WhisperFeatureExtractor"):
        FeatureSettings.read(tmp_path)


_AFTER_QNN = r"""
import sys
from pathlib import Path
from npurt import RunnerFactory
from npurt.models import DEFAULT_MODEL
from npurt.speech import audio
if sys.argv[1] == "decoder-first":
    audio.load_decoder()  # what Transcriber does before it makes its runners
runner = RunnerFactory.create_runner("QNN", DEFAULT_MODEL, {"device": "NPU", "log_level": "ERROR"})
try:
    print(len(audio.load(Path(sys.argv[2]))))
except audio.AudioError as e:
    print("AudioError:", e)
"""


@pytest.mark.parametrize("order", ["decoder-first", "qnn-first"])
def test_audio_after_the_qnn_ep_is_read_or_refused_never_a_crash(order: str, tmp_path: Path) -> None:
    """libsndfile loaded after onnxruntime-qnn's EP crashes the process in sf_open (its HTP emulator on x86-64):
    loaded first (as Transcriber does), files read; otherwise the read is an AudioError saying why, not a crash."""
    import subprocess
    import sys

    from tests.helpers.qnn import require_qnn

    require_qnn()
    path = tmp_path / "tone.wav"
    path.write_bytes(_encoded(_tone(0.5), 16000, "WAV", "PCM_16"))
    run = subprocess.run([sys.executable, "-c", _AFTER_QNN, order, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    if order == "decoder-first":
        assert run.stdout.strip() == "8000"
    else:
        assert run.stdout.startswith("AudioError: libsndfile (the audio decoder) cannot be loaded after Qualcomm's")
