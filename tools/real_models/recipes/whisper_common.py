"""What the whisper recipes share (venv encoders): the clips as samples, their log-mel features, CTranslate2's and
transformers' greedy decoding (whisper_onnx.py: the same over optimum's export with plain ONNX Runtime).

Decoding without timestamps, as every reference here does it: the prompt is ``PROMPT`` (``<|startoftranscript|>``
``<|notimestamps|>``: tiny.en is English-only, no language or task token); the generation config's
``suppress_tokens`` are masked at every step and its ``begin_suppress_tokens`` (" " and ``<|endoftext|>``) at the
first; greedy stops at ``<|endoftext|>``, which the ids given never include. The samples are a WAV's int16 / 32768 as
float32 (what ``soundfile.read(dtype="float32")`` gives); the features are transformers' ``WhisperFeatureExtractor``
with its defaults (padded or truncated to 30 s: [1, 80, 3000]).
"""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np

SOT, EOT, NO_TIMESTAMPS = 50257, 50256, 50362
PROMPT = [SOT, NO_TIMESTAMPS]
MAX_LENGTH = 448  # max_target_positions: prompt and generated ids together


def clips(folder: str | Path) -> list[dict[str, Any]]:
    """speech-clips' clips.json, each clip with its ``samples`` (float32, 16 kHz mono) added."""
    listed: list[dict[str, Any]] = json.loads((Path(folder) / "clips.json").read_text())["clips"]
    for clip in listed:
        with wave.open(str(Path(folder) / clip["file"])) as audio:
            assert (audio.getframerate(), audio.getnchannels(), audio.getsampwidth()) == (16000, 1, 2)
            frames = audio.readframes(audio.getnframes())
        clip["samples"] = np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0
    return listed


def features(extractor: Any, samples: np.ndarray) -> np.ndarray:
    """The feature extractor's log-mel features at its defaults: [1, n_mels, 3000], float32."""
    made: np.ndarray = extractor(samples, sampling_rate=16000, return_tensors="np").input_features
    return made.astype(np.float32)


def ct2_greedy(model: Any, feats: np.ndarray) -> list[int]:
    """CTranslate2's greedy ids (beam 1) after PROMPT, without ``<|endoftext|>`` (its ``sequences_ids``)."""
    import ctranslate2

    result = model.generate(ctranslate2.StorageView.from_array(feats), [PROMPT], beam_size=1, max_length=MAX_LENGTH)
    ids: list[int] = list(result[0].sequences_ids[0])
    return ids


def masked(logits: np.ndarray, step: int, suppress: list[int], begin_suppress: list[int]) -> np.ndarray:
    """The logits the greedy choice is made from: suppress_tokens masked, begin_suppress_tokens too at step 0."""
    scores = logits.astype(np.float32).copy()
    scores[suppress] = -np.inf
    if step == 0:
        scores[begin_suppress] = -np.inf
    return scores


def top_two_gap(scores: np.ndarray) -> float:
    top = np.partition(scores, -2)[-2:]
    return float(top[1] - top[0])


def hf_greedy(model: Any, feats: np.ndarray, max_new_tokens: int | None = None) -> tuple[list[int], list[float]]:
    """transformers' greedy ids at the folder's generation config (PROMPT, no timestamps), without
    ``<|endoftext|>``, and each step's top-two gap of the processed scores."""
    import torch

    with torch.no_grad():
        made = model.generate(input_features=torch.from_numpy(feats), do_sample=False, num_beams=1,
                              max_new_tokens=max_new_tokens, output_scores=True, return_dict_in_generate=True)
    ids = [int(i) for i in made.sequences[0].tolist()]
    if ids[:len(PROMPT)] == PROMPT:
        ids = ids[len(PROMPT):]
    ids = ids[:ids.index(EOT)] if EOT in ids else ids
    gaps = [top_two_gap(s[0].float().numpy()) for s in made.scores]
    return ids, gaps
