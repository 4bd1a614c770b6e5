"""The reference's greedy Whisper decode on an ``npurt.speech.model.WhisperModel`` (its prompt, suppressions and
length, as tools/real_models' whisper references record them), and the speech clips' features."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.helpers.real_models import folder, reference


def clip_features() -> dict[str, np.ndarray]:
    """Each speech clip's log-mel features as transformers computed them (whisper-optimum's reference)."""
    optimum = folder("whisper-optimum")
    return {c["clip"]: np.load(optimum / c["features"]) for c in reference("whisper-optimum")["clips"]
            if c["features"]}


def reference_greedy(model: Any, features: np.ndarray, ref: dict[str, Any]) -> tuple[list[int], Any]:
    """The reference's greedy decode of ``features`` [80, frames] on ``model``: its ids, and the window's cache
    (still held: the caller releases it)."""
    logits, cache = model.prefill(model.encode(features[None]), ref["prompt_ids"])
    scores = logits[-1:].astype(np.float32)
    ids: list[int] = []
    while len(ids) < ref["max_new_tokens"]:
        scores[:, ref["suppress_tokens"]] = -np.inf
        if not ids:
            scores[:, ref["begin_suppress_tokens"]] = -np.inf
        token = int(np.argmax(scores[0]))
        if token == ref["eot_id"]:
            break
        ids.append(token)
        scores = np.array(model.step(cache, [token]), np.float32)
    return ids, cache
