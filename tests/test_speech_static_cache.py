"""The Whisper decoder's static self-attention cache (``npurt.speech.static_cache``): the pinned-shape (NPU) path's
steps over a cache of max_target_positions rows, run where the runners' shapes are pinned (here forced on the CPU
backends with option ``static_shapes``), checked against the export before first use. Ids equal to the reference's
(transformers' on the random-weight Whisper, CTranslate2's on the real tiny.en) and to the growing cache's, greedy
and beam; the check refuses a wrong form."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from npurt import RunnerFactory
from npurt.speech import Transcriber, static_cache
from npurt.speech.audio import load_decoder
from npurt.speech.model import WhisperModel
from npurt.types import NpuUnsupportedError
from tests.helpers.real_models import folder, reference
from tests.helpers.whisper import clip_features, reference_greedy

load_decoder()  # libsndfile before any runner: after onnxruntime-qnn's EP it crashes (npurt.speech.audio)

PINNED = {"static_shapes": True}  # as an NPU's runners: one compiled engine per input shape


def _greedy(model: WhisperModel, features: np.ndarray, ref: dict[str, Any]) -> list[int]:
    """The reference's greedy decode on ``model``, its cache checked (static where the model's is) and released."""
    ids, cache = reference_greedy(model, features, ref)
    assert cache.static == model.static and cache.length == len(ref["prompt_ids"]) + len(ids)
    model.release(cache)
    return ids


def test_random_whisper_pinned_greedy_equals_transformers_in_one_compiled_shape() -> None:
    """Shapes pinned: the steps run the static form (checked against the export at load), give transformers' ids,
    and compile one shape for every step; the growing cache with the same pinned shapes compiles one per length
    (ONNXRUNTIME here; VAIML on the real tiny.en below)."""
    backend = "ONNXRUNTIME"
    root, ref = folder("whisper-random"), reference("whisper-random")
    features = clip_features()
    model = WhisperModel(root, backend, PINNED)
    try:
        assert model.pinned and model.static and not model.static_refused, model.describe()
        assert "static: 448 rows" in model.describe()
        verdict = model.static_verdict
        assert verdict is not None and verdict["ok"] and verdict["max_diff"] <= verdict["tolerance"]
        for clip in ref["clips"]:
            assert _greedy(model, features[clip["clip"]], ref) == clip["ids"], clip["clip"]
        assert model.decoder_with_past.stats["compiles"] == 1
    finally:
        model.close()
    growing = WhisperModel(root, backend, PINNED, static_cache=False)
    try:
        assert growing.pinned and not growing.static
        clip = ref["clips"][0]
        assert _greedy(growing, features[clip["clip"]], ref) == clip["ids"]
        assert growing.decoder_with_past.stats["compiles"] == len(clip["ids"])  # a shape per step
    finally:
        growing.close()


def test_static_steps_follow_beam_reorders_as_the_growing_cache_does() -> None:
    """The same prefill and steps on the static and the growing cache: rows chosen, reordered (two reorders before
    a step compose), grown (1 -> 3) and shrunk (3 -> 2); logits equal step by step."""
    root = folder("whisper-random")
    static = WhisperModel(root, "ONNXRUNTIME", static_cache=True)
    growing = WhisperModel(root, "ONNXRUNTIME")
    try:
        assert static.static and not static.pinned and not growing.static
        hidden = static.encode(np.random.default_rng(1).standard_normal((1, 80, 3000)).astype(np.float32))
        (first, a), (first_growing, b) = static.prefill(hidden, [50257, 50362]), growing.prefill(hidden, [50257, 50362])
        np.testing.assert_array_equal(first, first_growing)
        plan: list[tuple[list[int] | None, list[int]]] = [
            (None, [11]), ([0, 0, 0], [5, 6, 7]), ([2, 0, 1], [8, 9, 10]), ([1, 1, 0], [12, 13, 14]),
            ([0, 2], [15, 16]), (None, [17, 18])]
        for rows, ids in plan:
            if rows is not None:
                for cache in (a, b):
                    cache.select(rows)
                    if rows == [2, 0, 1]:
                        cache.select([1, 1, 0])
            np.testing.assert_allclose(static.step(a, ids), growing.step(b, ids), rtol=0, atol=2e-5)
            assert a.rows == b.rows and a.length == b.length
        a.position = static.static_layout.max_length if static.static_layout else 0
        with pytest.raises(ValueError, match="448 positions"):
            static.step(a, [1, 2])
    finally:
        static.close()
        growing.close()


def _utterances() -> dict[str, np.ndarray]:
    root = folder("speech-clips")
    found = {}
    for clip in json.loads((root / "clips.json").read_text())["clips"]:
        if clip["kind"] == "utterance":
            with wave.open(str(root / clip["file"])) as audio:
                found[clip["name"]] = np.frombuffer(audio.readframes(audio.getnframes()),
                                                    np.int16).astype(np.float32) / 32768
    return found


def test_random_whisper_transcriber_pinned_equals_growing_greedy_and_beam() -> None:
    """``Transcriber`` with pinned shapes gives the growing cache's ids on the speech clips, greedy and beam 5; its
    steps compile one shape per row count (1 greedy, 5 beams)."""
    root = folder("whisper-random")
    clips = list(_utterances().items())[:2]
    with Transcriber(root, "ONNXRUNTIME", options=PINNED) as pinned, Transcriber(root, "ONNXRUNTIME") as growing:
        assert pinned.model.static and not growing.model.static
        for name, samples in clips:
            for beam in (1, 5):
                got = pinned.transcribe(samples, sample_rate=16000, beam_size=beam, max_new_tokens=20)
                want = growing.transcribe(samples, sample_rate=16000, beam_size=beam, max_new_tokens=20)
                assert got.ids == want.ids and len(got.ids) > 0, (name, beam)
        assert pinned.model.decoder_with_past.stats["compiles"] == 2
        # the beams' row count checked at its first step against each row alone (a pinned device's batch)
        assert list(pinned.model.batch_checks) == [5] and pinned.model.batch_checks[5][0], pinned.model.batch_checks
        assert not growing.model.batch_checks


class _WrongSecondRow:
    """Fault injection, as a device that computes a batch row wrong would (the embedder met one on Qualcomm's HTP):
    the runner's outputs as they are, but row 1's logits of a run of several rows negated."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(self.runner.run(feeds))
        if feeds["input_ids"].shape[0] > 1:
            out["logits"] = out["logits"].copy()
            out["logits"][1] *= -1
        return out


def test_a_row_count_computed_wrong_runs_a_row_at_a_time() -> None:
    """Where a step of several rows gives a row's logits other than that row alone, the steps of that row count run
    a row at a time from then on, saying so: the beams' logits are then the rows' own."""
    root = folder("whisper-random")
    model = WhisperModel(root, "ONNXRUNTIME", PINNED)
    try:
        real = model.decoder_with_past
        hidden = model.encode(np.random.default_rng(2).standard_normal((1, 80, 3000)).astype(np.float32))
        _, a = model.prefill(hidden, [50257, 50362])
        _, b = model.prefill(hidden, [50257, 50362])
        model.step(a, [11])
        model.step(b, [11])
        a.select([0, 0])
        want = model.step(a, [5, 7])  # the device's batch as it is: checked, used
        assert model.batch_checks[2][0]
        model.batch_checks.clear()
        model.decoder_with_past = _WrongSecondRow(real)
        b.select([0, 0])
        with pytest.warns(RuntimeWarning, match="steps of 2 rows run a row at a time"):
            got = model.step(b, [5, 7])
        assert not model.batch_checks[2][0] and model.batch_checks[2][1] < 0
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)  # the rows' own logits, not the wrong batch's
        np.testing.assert_allclose(model.step(b, [9, 9]), model.step(a, [9, 9]), rtol=0, atol=1e-5)  # later too
        model.decoder_with_past = real
    finally:
        model.close()


def test_the_check_refuses_a_wrong_form(tmp_path: Path) -> None:
    """A form whose mask lets the row at the position count (noise in the check's cache) is refused; so is an
    export the derivation does not understand, which then runs on the growing cache, saying why."""
    root = folder("whisper-random")
    export = root / "decoder_with_past_model.onnx"
    made = tmp_path / "made"
    path, layout = static_cache.static_decoder(export, made, copy_weights=True)
    wrong = onnx.load(str(path))
    less = [n for n in wrong.graph.node if n.op_type == "Less" and n.name.startswith("__npurt_static_cache")]
    assert len(less) == 1
    less[0].op_type = "LessOrEqual"
    bad = tmp_path / "bad"
    bad.mkdir()
    onnx.save(wrong, str(bad / static_cache.FILE))
    with pytest.raises(NpuUnsupportedError, match="does not give the export's logits"):
        static_cache.check(export, bad / static_cache.FILE, layout, "onnxruntime", bad).verdict()
    assert static_cache.check(export, path, layout, "onnxruntime", made).verdict()["ok"]  # the form as made
    # decoder_model.onnx (no past) as the with-past file: no static form; refused where asked for
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        (odd / name).symlink_to(root / name)
    (odd / "decoder_with_past_model.onnx").symlink_to(root / "decoder_model.onnx")
    with pytest.raises(NpuUnsupportedError, match="past_key_values"):
        WhisperModel(odd, "ONNXRUNTIME", static_cache=True)
    model = WhisperModel(odd, "ONNXRUNTIME", PINNED)
    try:
        assert not model.static and model.static_refused and "past_key_values" in model.static_refused
        assert "growing" in model.describe()
    finally:
        model.close()


def test_the_form_and_its_verdict_are_kept_in_cache_dir(tmp_path: Path) -> None:
    root = folder("whisper-random")
    kept = static_cache.folder_for(root / "decoder_with_past_model.onnx", tmp_path)
    model = WhisperModel(root, "ONNXRUNTIME", {**PINNED, "cache_dir": tmp_path})
    model.close()
    form, verdict = kept / static_cache.FILE, kept / "verified-onnxruntime-whisper-step.json"
    assert form.is_file() and json.loads(verdict.read_text())["ok"]
    written = form.stat().st_mtime_ns, verdict.stat().st_mtime_ns
    again = WhisperModel(root, "ONNXRUNTIME", {**PINNED, "cache_dir": tmp_path})
    try:
        assert again.static and again.static_verdict and again.static_verdict["ok"]
    finally:
        again.close()
    assert (form.stat().st_mtime_ns, verdict.stat().st_mtime_ns) == written  # read back, not derived or checked again
    model = WhisperModel(root, "ONNXRUNTIME", PINNED)  # without cache_dir: a folder of its own, gone at close
    temporary = model._temporary
    assert temporary is not None and (temporary / static_cache.FILE).is_file()
    model.close()
    assert not temporary.exists()


@pytest.mark.skipif("VAIML" not in RunnerFactory.available_backends(), reason="no VAIML backend")
def test_tiny_en_pinned_on_vaiml_equals_ctranslate2() -> None:
    """The real tiny.en with pinned shapes on VAIML: the static cache's greedy ids equal CTranslate2's on three
    utterances (every one of them in a hand run)."""
    expected = {c["clip"]: c["ct2_ids"] for c in reference("whisper-optimum")["clips"]}
    with Transcriber(folder("whisper-optimum"), "VAIML", options=PINNED) as t:
        assert t.model.static, t.model.describe()
        for name, samples in list(_utterances().items())[:3]:
            assert list(t.transcribe(samples, sample_rate=16000).ids) == expected[name], name
        assert t.model.decoder_with_past.stats["compiles"] == 1


@pytest.mark.skipif("QNN" not in RunnerFactory.available_backends(), reason="no QNN backend (the HTP emulator)")
def test_random_whisper_static_steps_on_the_htp_emulator() -> None:
    """QNN's HTP emulator (backend QNN, device NPU: pinned without options) runs the static form's steps in one
    compiled shape, every node on the QNN EP, no host copy a step, the logits those of the export's growing cache
    on ONNX Runtime's CPU within the HTP's fp16 (the encoder skipped: 70 s of the emulator a window)."""
    root = folder("whisper-random")
    htp = WhisperModel(root, "QNN", {"device": "NPU"})
    cpu = WhisperModel(root, "ONNXRUNTIME")
    try:
        assert htp.pinned and htp.static, htp.describe()
        hidden = np.random.default_rng(0).standard_normal((1, 1500, 64)).astype(np.float32)
        (_, a), (_, b) = htp.prefill(hidden, [50257, 50362]), cpu.prefill(hidden, [50257, 50362])
        for ids in ([11], [220], [5]):
            want = cpu.step(b, ids)
            got = htp.step(a, ids)
            assert float(np.max(np.abs(got - want))) <= 1e-2 * float(np.max(np.abs(want))), ids
        assert htp.decoder_with_past.stats["compiles"] == 1 and htp.decoder_with_past.stats["copies"] == 0
        a.select([0, 0])  # two beams: the HTP's [2, 1] step checked against each row alone (bit-equal here)
        htp.step(a, [7, 9])
        assert htp.batch_checks[2][0], htp.batch_checks
        placement = dict(htp.decoder_with_past.device_info.placement)  # (known once its shape is compiled)
        assert list(placement) == ["QNNExecutionProvider"], placement
    finally:
        htp.close()
        cpu.close()
