"""The whisper fixture of tools/real_models (issue 58): speech-clips' WAVs are what clips.json says, the references
of whisper-hf and whisper-optimum agree with each other and decode to their texts, the saved log-mel features are
[80, 3000], and plain ONNX Runtime over the saved features and export gives the references' greedy ids (the real
model's, and the random one's). No torch here: the references were made in the conversion venv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import soundfile
from tokenizers import Tokenizer

from tests.helpers.real_models import folder, reference
from tests.helpers.whisper import clip_features

EOT = 50256


def _greedy(export: Path, features: np.ndarray, prompt: list[int], suppress: list[int], begin_suppress: list[int],
            max_new_tokens: int) -> list[int]:
    """Greedy over optimum's encoder and merged decoder: suppress_tokens masked at every step, begin_suppress_tokens
    at the first; the ids without <|endoftext|>."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    encoder = ort.InferenceSession(str(export / "encoder_model.onnx"), options, providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(export / "decoder_model_merged.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    hidden = encoder.run(None, {"input_features": features[None]})[0]
    past = {i.name: i.shape for i in decoder.get_inputs() if i.name.startswith("past_key_values.")}
    feeds: dict[str, Any] = {name: np.zeros((1, shape[1], 0, shape[3]), np.float32) for name, shape in past.items()}
    feeds.update(input_ids=np.array([prompt], np.int64), encoder_hidden_states=hidden,
                 use_cache_branch=np.array([False]))
    names = [o.name.replace("present", "past_key_values") for o in decoder.get_outputs()]
    ids: list[int] = []
    for step in range(max_new_tokens):
        outputs = dict(zip(names, decoder.run(None, feeds), strict=True))
        scores = outputs["logits"][0, -1].copy()
        scores[suppress] = -np.inf
        if step == 0:
            scores[begin_suppress] = -np.inf
        chosen = int(np.argmax(scores))
        if chosen == EOT:
            break
        ids.append(chosen)
        if step == 0:  # the cross-attention keys and values of the first run, kept
            feeds.update({k: v for k, v in outputs.items() if ".encoder." in k})
        feeds.update({k: v for k, v in outputs.items() if ".decoder." in k})
        feeds.update(input_ids=np.array([[chosen]], np.int64), use_cache_branch=np.array([True]))
    return ids


def test_speech_clips_are_what_clips_json_says():
    root = folder("speech-clips")
    listed = json.loads((root / "clips.json").read_text())
    ref = reference("speech-clips")
    assert listed["sample_rate"] == 16000 and ref["clips"] == listed["clips"]
    kinds = [clip["kind"] for clip in listed["clips"]]
    assert kinds.count("utterance") >= 6 and kinds.count("passage") == 1
    for clip in listed["clips"]:
        info = soundfile.info(str(root / clip["file"]))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16"), clip["name"]
        assert abs(info.frames / 16000 - clip["seconds"]) < 1e-3
        low, high = (3.0, 10.0) if clip["kind"] == "utterance" else (45.0, 60.0)
        assert low <= clip["seconds"] <= high, clip["name"]
    # keyed on the tools' versions: a built product is the one these tools make
    for tool in ("espeak-ng", "sox"):
        version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
        assert ref[tool] == version


def test_references_agree_and_decode_to_their_texts():
    hf, optimum = reference("whisper-hf"), reference("whisper-optimum")
    assert hf["prompt_ids"] == optimum["prompt_ids"] == [50257, 50362]
    assert not hf["eot_included"] and not optimum["eot_included"]
    tokenizer = Tokenizer.from_file(str(folder("whisper-optimum") / "tokenizer.json"))
    # transformers' greedy ids over whisper-hf are CTranslate2's, for every utterance and the passage's first window
    greedy = {c["clip"]: c["ids"] for c in hf["clips"]}
    assert greedy.pop(optimum["passage"]["clip"]) == optimum["passage"]["ct2_first_window_ids"]
    assert greedy == {c["clip"]: c["ct2_ids"] for c in optimum["clips"]}
    for clip in optimum["clips"]:
        assert EOT not in clip["ct2_ids"] and EOT not in clip["hf_beam5_ids"]
        assert tokenizer.decode(clip["ct2_ids"], skip_special_tokens=True) == clip["ct2_text"]
        assert tokenizer.decode(clip["hf_beam5_ids"], skip_special_tokens=True) == clip["hf_beam5_text"]
        assert len(clip["gaps"]) == len(clip["ct2_ids"]) + 1 and min(clip["gaps"]) >= 0
    passage = optimum["passage"]
    segments = passage["hf_timestamps"]
    assert all(a["end"] <= b["start"] for a, b in zip(segments, segments[1:]))
    assert segments[0]["start"] == 0.0 and 30.0 < segments[-1]["end"] <= passage["seconds"] + 0.5
    for segment in segments:
        assert segment["start"] <= segment["end"] and segment["ids"][0] >= 50363  # opens with a timestamp
        assert tokenizer.decode(segment["ids"], skip_special_tokens=True) == segment["text"]
    assert "".join(s["text"] for s in segments) == passage["hf_text"]


def test_saved_features_give_ctranslate2s_ids_through_the_export():
    root, ref = folder("whisper-optimum"), reference("whisper-optimum")
    assert len(ref["features"]) >= 2
    for file in ref["features"].values():
        features = np.load(root / file)
        assert features.shape == (80, 3000) and features.dtype == np.float32
        assert features.max() - features.min() <= 2.0 + 1e-6  # the extractor clamps to 8 below the maximum, /4
    passage = ref["passage"]
    long = np.load(root / passage["long_features"])  # the whole passage's, for long-form decoding
    assert list(long.shape) == passage["long_features_shape"] and long.shape[0] == 80
    assert abs(long.shape[1] - passage["seconds"] * 100) <= 2 and long.max() - long.min() <= 2.0 + 1e-6
    clip = ref["clips"][0]
    features = np.load(root / clip["features"])
    ids = _greedy(root, features, ref["prompt_ids"], ref["suppress_tokens"], ref["begin_suppress_tokens"], 100)
    assert ids == clip["ct2_ids"]


def test_random_whisper_gives_transformers_ids():
    root, ref = folder("whisper-random"), reference("whisper-random")
    features = clip_features()
    for clip in ref["clips"]:
        ids = _greedy(root, features[clip["clip"]], ref["prompt_ids"], ref["suppress_tokens"],
                      ref["begin_suppress_tokens"], ref["max_new_tokens"])
        assert ids == clip["ids"], clip["clip"]
