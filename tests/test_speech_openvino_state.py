"""The OPENVINO decoder's self-attention cache as OpenVINO state (``npurt.speech.openvino_state``, ``speech.model``):
on the real whisper tiny.en beam 5 and long-form timestamps equal transformers' with it (the greedy ids:
test_speech_whisper's OPENVINO case, which runs it too); on the random-weight Whisper every step's logits equal the
cache fed back, through beam reorders and row counts that change, with pooled streams reused clean; the derived
form kept in cache_dir; the clear errors."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest

from npurt import RunnerFactory
from npurt.speech import Transcriber, openvino_state
from npurt.speech.audio import load_decoder
from npurt.speech.model import WhisperModel
from npurt.types import NpuError
from tests.helpers.real_models import folder, reference
from tests.helpers.whisper import clip_features, reference_greedy

pytestmark = pytest.mark.skipif("OPENVINO" not in RunnerFactory.available_backends(), reason="no OPENVINO backend")
load_decoder()  # libsndfile before any runner: after onnxruntime-qnn's EP it crashes (npurt.speech.audio)

PROMPT = [50257, 50362]  # <|startoftranscript|> <|notimestamps|>


def _samples(name: str) -> np.ndarray:
    root = folder("speech-clips")
    listed = {c["name"]: c for c in json.loads((root / "clips.json").read_text())["clips"]}
    with wave.open(str(root / listed[name]["file"])) as audio:
        return np.frombuffer(audio.readframes(audio.getnframes()), np.int16).astype(np.float32) / 32768


def test_beam_5_and_timestamps_on_openvino_state_equal_transformers() -> None:
    ref = reference("whisper-optimum")
    with Transcriber(folder("whisper-optimum"), "OPENVINO", "CPU") as t:
        assert t.model.stateful and "OpenVINO state" in t.model.describe()
        # beam search first (the window's first step takes five rows: the case gathered on the host, see
        # WhisperModel._stateful_step), on half the utterances (ONNXRUNTIME's test takes every one)
        for clip in ref["clips"][::2]:
            got = t.transcribe(_samples(clip["clip"]), sample_rate=16000, beam_size=5)
            assert list(got.ids) == clip["hf_beam5_ids"], (clip["clip"], got.text, clip["hf_beam5_text"])
        passage = ref["passage"]
        long = t.transcribe(_samples(passage["clip"]), sample_rate=16000, timestamps=True)
        assert [list(s.ids) for s in long.segments] == [s["ids"] for s in passage["hf_timestamps"]]
        # one stream a window decoded at once, reused window after window; no host copy on the way
        assert len(t.model._streams) == 1
        assert all(r.stats["copies"] == 0 for r in (t.model.encoder, t.model.decoder, t.model.decoder_with_past))


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert float(np.max(np.abs(got - want))) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))


def test_steps_equal_the_cache_fed_back() -> None:
    """The random-weight Whisper: the same prefill and steps on both paths, beam reorders composed before a step,
    the rows growing (1 -> 3) and shrinking (3 -> 2); then a second window of other features on the pooled stream,
    which starts clean, its prompt's cross-attention keys and values written into the first window's arrays."""
    root = folder("whisper-random")
    state = WhisperModel(root, "OPENVINO", {"device": "CPU"})
    fed = WhisperModel(root, "OPENVINO", {"device": "CPU"}, stateful=False)
    try:
        assert state.stateful and not fed.stateful
        rng = np.random.default_rng(1)
        released: dict[str, np.ndarray] = {}  # (held here: a freed array's id could come back by chance)
        for window in range(2):
            features = rng.standard_normal((1, state.n_mels, state.frames)).astype(np.float32)
            hidden = state.encode(features)
            _close(hidden, fed.encode(features))
            (first, a), (first_fed, b) = state.prefill(hidden, PROMPT), fed.prefill(hidden, PROMPT)
            _close(first, first_fed)
            assert a.cross_kv.keys() == b.cross_kv.keys()
            for name, array in a.cross_kv.items():
                _close(array, b.cross_kv[name])
            if released:  # (the pooled arrays, overwritten by this window's prompt)
                assert all(a.cross_kv[name] is array for name, array in released.items())
            released = dict(a.cross_kv)
            plan: list[tuple[list[int] | None, list[int]]] = [
                (None, [11]), (None, [220]), ([0, 0, 0], [5, 6, 7]), ([2, 0, 1], [8, 9, 10]), ([1, 1, 0], [12, 13, 14]),
                ([0, 2], [15, 16]), (None, [17 + window, 18])]
            for rows, ids in plan:
                if rows is not None:
                    a.select(rows)
                    b.select(rows)
                    if rows == [2, 0, 1]:  # two reorders before one step compose
                        a.select([1, 1, 0])
                        b.select([1, 1, 0])
                _close(state.step(a, ids), fed.step(b, ids))
                assert a.rows == b.rows and a.length == b.length
            state.release(a)
            fed.release(b)
            assert len(state._streams) == 1
            with pytest.raises(ValueError, match="released"):
                state.step(a, [1, 2])
    finally:
        state.close()
        fed.close()


def test_the_stateful_form_is_kept_in_cache_dir(tmp_path: Path) -> None:
    root = folder("whisper-random")
    with_past = root / "decoder_with_past_model.onnx"
    model = WhisperModel(root, "OPENVINO", {"device": "CPU", "cache_dir": tmp_path})
    made = openvino_state.folder_for(with_past, tmp_path) / openvino_state.FILE
    try:
        assert made.is_file() and made.with_suffix(".bin").is_file()
        written = made.stat().st_mtime_ns
    finally:
        model.close()
    again = WhisperModel(root, "OPENVINO", {"device": "CPU", "cache_dir": tmp_path})
    again.close()
    assert made.stat().st_mtime_ns == written  # read back, not derived again
    assert not list(made.parent.glob("*.partial.*"))
    # without cache_dir: a folder of its own, gone at close
    model = WhisperModel(root, "OPENVINO", {"device": "CPU"})
    temporary = model._temporary
    assert temporary is not None and (temporary / openvino_state.FILE).is_file()
    model.close()
    assert not temporary.exists()


def test_clear_errors(tmp_path: Path) -> None:
    root = folder("whisper-random")
    with pytest.raises(ValueError, match="OPENVINO's CPU"):
        WhisperModel(root, "ONNXRUNTIME", stateful=True)
    # a model that is no with-past decoder: the child's reason, and nothing left behind
    made = tmp_path / "made"
    with pytest.raises(NpuError, match="past_key_values"):
        openvino_state.stateful_decoder(root / "encoder_model.onnx", made)
    assert list(made.iterdir()) == []
    # a folder whose with-past file cannot take the form: fed back, saying why; refused where asked for
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        (odd / name).symlink_to(root / name)
    (odd / "decoder_with_past_model.onnx").symlink_to(root / "decoder_model.onnx")
    model = WhisperModel(odd, "OPENVINO", {"device": "CPU"})
    try:
        assert not model.stateful and model.state_refused and "past_key_values" in model.state_refused
        assert "fed back" in model.describe()
    finally:
        model.close()
    with pytest.raises(NpuError, match="cannot keep its self-attention cache as state"):
        WhisperModel(odd, "OPENVINO", {"device": "CPU"}, stateful=True)


def test_random_whisper_greedy_on_openvino_state_equals_transformers() -> None:
    """The random-weight Whisper's greedy ids (its reference: transformers', 20 ids after <|startoftranscript|>)
    through the stateful steps, released and taken again clip after clip."""
    root, ref = folder("whisper-random"), reference("whisper-random")
    features = clip_features()
    model = WhisperModel(root, "OPENVINO", {"device": "CPU"})
    try:
        assert model.stateful
        for clip in ref["clips"]:
            ids, cache = reference_greedy(model, features[clip["clip"]], ref)
            model.release(cache)
            assert ids == clip["ids"], clip["clip"]
    finally:
        model.close()


def test_openvino_genai_folder_gives_npurt_s_text() -> None:
    """tools/real_models' whisper-openvino (optimum-intel's IR, benchmarks/speech.py's OpenVINO GenAI side): its
    WhisperPipeline's text, as its reference recorded it when the folder was built, equals npurt's on OPENVINO on two
    utterances (the pipeline itself is not loaded again here: 8 s of the suite)."""
    folder("whisper-openvino")
    ref = reference("whisper-openvino")
    with Transcriber(folder("whisper-optimum"), "OPENVINO", "CPU") as t:
        for clip in ref["clips"][:2]:
            samples = _samples(clip["clip"])
            text = t.transcribe(samples, sample_rate=16000).text.strip()
            assert text == clip["genai_text"].strip() == clip["ct2_text"].strip()
