"""Plain ONNX Runtime greedy decoding over optimum's Whisper export (venv encoders), as whisper_common.py says: the
check that an export gives the reference's ids, and the top-two gaps of its logits."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from whisper_common import EOT, MAX_LENGTH, PROMPT, masked, top_two_gap


@functools.cache
def session(path: Path) -> Any:
    """One session a file for the whole recipe (loading a 200-MB decoder costs seconds)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_greedy(folder: Path, feats: np.ndarray, suppress: list[int], begin_suppress: list[int],
               merged: bool, max_new_tokens: int = MAX_LENGTH - len(PROMPT)) -> tuple[list[int], list[float]]:
    """Plain ONNX Runtime greedy over optimum's export: encoder_model.onnx once, then decoder_model_merged.onnx
    (``merged``: use_cache_branch False for the prompt, True after) or decoder_model.onnx then
    decoder_with_past_model.onnx. The ids (without ``<|endoftext|>``) and each step's top-two gap of the masked
    logits."""
    hidden = session(folder / "encoder_model.onnx").run(None, {"input_features": feats})[0]
    first = session(folder / ("decoder_model_merged.onnx" if merged else "decoder_model.onnx"))
    step_session = first if merged else session(folder / "decoder_with_past_model.onnx")
    step_inputs = {i.name for i in step_session.get_inputs()}
    cache_names = [o.name.replace("present", "past_key_values") for o in first.get_outputs()[1:]]
    feeds: dict[str, np.ndarray] = {"input_ids": np.array([PROMPT], np.int64), "encoder_hidden_states": hidden}
    if merged:  # the no-cache branch reads no cache, but the graph takes one: empty self-attention rows
        cache_shapes = {i.name: i.shape for i in first.get_inputs()}
        for name in cache_names:
            heads, head_dim = cache_shapes[name][1], cache_shapes[name][3]
            feeds[name] = np.zeros((1, heads, 0, head_dim), np.float32)
        feeds["use_cache_branch"] = np.array([False])
    outputs = first.run(None, feeds)
    ids: list[int] = []
    gaps: list[float] = []
    cache = dict(zip(cache_names, outputs[1:], strict=True))
    for step in range(max_new_tokens):
        scores = masked(outputs[0][0, -1], step, suppress, begin_suppress)
        chosen = int(np.argmax(scores))
        gaps.append(top_two_gap(scores))
        if chosen == EOT:
            break
        ids.append(chosen)
        feeds = {"input_ids": np.array([[chosen]], np.int64), **cache}
        if merged:
            feeds.update(encoder_hidden_states=hidden, use_cache_branch=np.array([True]))
        outputs = step_session.run(None, {k: v for k, v in feeds.items() if k in step_inputs})
        # a step updates the self-attention rows only: the cross-attention keys and values stay the first run's
        step_names = [o.name.replace("present", "past_key_values") for o in step_session.get_outputs()[1:]]
        cache.update((k, v) for k, v in zip(step_names, outputs[1:], strict=True) if ".decoder." in k)
    return ids, gaps
