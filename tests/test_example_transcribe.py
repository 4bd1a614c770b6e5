"""examples/transcribe.py on the real whisper tiny.en: a file's text, and a live stream cut into utterances by
silero-vad, each utterance's text printed as the stream goes (the same cuts silero's rules give on the whole
signal, the same text npurt.Transcriber gives each cut)."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

from npurt.models import zoo
from npurt.speech import Transcriber
from npurt.speech.vad import SileroVad, Utterances, speech_spans
from tests.helpers.real_models import folder

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transcribe.py"


def _read(path: Path) -> np.ndarray:
    with wave.open(str(path)) as audio:
        return np.frombuffer(audio.readframes(audio.getnframes()), np.int16).astype(np.float32) / 32768


def _write(path: Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


def _example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=240)


def test_a_file_and_a_live_stream(tmp_path: Path) -> None:
    model, clips = folder("whisper-optimum"), folder("speech-clips")
    zoo.path("silero_vad")  # (fetched once, before the example needs it)
    question, fox = _read(clips / "question.wav"), _read(clips / "fox.wav")
    silence = np.zeros(16000, np.float32)
    stream = np.concatenate([silence, question, silence, fox, silence / 2])
    _write(tmp_path / "two.wav", stream)
    with Transcriber(model, backend="ONNXRUNTIME") as transcriber:
        whole = transcriber.transcribe(clips / "question.wav").text.strip()
        vad = SileroVad.load("ONNXRUNTIME")
        try:
            spans = speech_spans(vad, stream, min_silence_ms=300)
            live = [(start, len(piece)) for start, piece in _pushed(Utterances(vad, min_silence_ms=300), stream)]
        finally:
            vad.close()
        assert len(spans) == 2, spans  # the two sentences, apart
        assert live == [(s / 16000, e - s) for s, e in spans]  # streaming cuts where the whole signal's rules cut
        texts = [transcriber.transcribe(stream[s:e], sample_rate=16000).text.strip() for s, e in spans]

    run = _example(str(model), str(clips / "question.wav"), "--backend", "onnxruntime")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == whole

    run = _example(str(model), str(tmp_path / "two.wav"), "--live", "--backend", "onnxruntime")
    assert run.returncode == 0, run.stderr
    printed = [line.split("] ", 1)[1] for line in run.stdout.splitlines() if line.startswith("[")]
    assert printed == texts
    assert "train station" in printed[0] and "lazy" in printed[1]


def _pushed(utterances: Utterances, stream: np.ndarray) -> list[tuple[float, np.ndarray]]:
    got: list[tuple[float, np.ndarray]] = []
    for at in range(0, len(stream), 1600):  # 100 ms at a time, as a live source gives it
        got += list(utterances.push(stream[at:at + 1600]))
    return got + list(utterances.finish())
