"""Greedy generation by the engines used directly, on the decoders of `npurt.models.decoders`: what npurt's
``decoder`` option and ``npurt.Generator`` are checked against (tests) and timed against (benchmarks).

- `greedy_onnxruntime`: plain ONNX Runtime (CPU provider) over the dynamic model, the KV cache growing by Concat:
  the new tokens, the logits each was picked from, and each step's top-2 logit gap.
- `greedy_openvino`: the same loop on OpenVINO's CPU plugin at ``INFERENCE_PRECISION_HINT`` f32.
- `greedy_genai`: onnxruntime-genai's own greedy search over the model's folder (``genai_config.json``).
- `agreeing_prefix`: how many leading tokens two engines must agree on: all, or those before the reference's first
  step whose top-2 gap is under a tolerance (engines at f32 differ by ~1e-5: a near-tie may pick either token).

The engines are imported when called (onnxruntime-genai is a test extra).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .decoders import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    PAST_KEY,
    PAST_VALUE,
    POSITION_IDS,
    PRESENT_KEY,
    PRESENT_VALUE,
)

NEAR_TIE = 1e-3  # the top-2 logit gap under which a greedy step may pick either token


@dataclass
class Greedy:
    """A greedy run: the new tokens, and per step the logits (float32 [vocab]) each was picked from and their top-2
    gap (largest minus second largest)."""

    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)


def top2_gap(logits: np.ndarray) -> float:
    """The largest logit minus the second largest."""
    top = np.partition(logits.astype(np.float64), -2)[-2:]
    return float(top[1] - top[0])


def agreeing_prefix(reference: Greedy, tolerance: float = NEAR_TIE) -> int:
    """How many leading tokens must equal the reference's: up to (not including) its first step whose top-2 gap is
    under ``tolerance``; all of them where there is none."""
    for k, gap in enumerate(reference.gaps):
        if gap < tolerance:
            return k
    return len(reference.tokens)


@dataclass(frozen=True)
class _Ports:
    layers: int
    kv_heads: int
    head_dim: int
    has_position_ids: bool


def _ports(inputs: dict[str, Sequence[Any]]) -> _Ports:
    """The KV layout read from the model's inputs {name: shape}."""
    layers = sum(1 for name in inputs if name.startswith("past_key_values.") and name.endswith(".key"))
    if layers == 0 or PAST_KEY % 0 not in inputs:
        raise ValueError(f"not a decoder with {PAST_KEY % 0!r}: inputs {sorted(inputs)}")
    shape = inputs[PAST_KEY % 0]
    return _Ports(layers, int(shape[1]), int(shape[3]), POSITION_IDS in inputs)


def _greedy(step: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], ports: _Ports,
            prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> Greedy:
    if not prompt_ids:
        raise ValueError("an empty prompt")
    out = Greedy()
    past: dict[str, np.ndarray] = {}
    for i in range(ports.layers):
        for name in (PAST_KEY % i, PAST_VALUE % i):
            past[name] = np.zeros((1, ports.kv_heads, 0, ports.head_dim), dtype=np.float32)
    ids = np.asarray([prompt_ids], dtype=np.int64)
    total = ids.shape[1]
    for _ in range(max_new_tokens):
        feeds: dict[str, np.ndarray] = {INPUT_IDS: ids, ATTENTION_MASK: np.ones((1, total), dtype=np.int64), **past}
        if ports.has_position_ids:
            feeds[POSITION_IDS] = np.arange(total - ids.shape[1], total, dtype=np.int64)[None, :]
        results = step(feeds)
        logits = np.array(results[LOGITS][0, -1], dtype=np.float32)
        token = int(np.argmax(logits))
        out.tokens.append(token)
        out.logits.append(logits)
        out.gaps.append(top2_gap(logits))
        if token == eos_token_id:
            break
        past = {}
        for i in range(ports.layers):
            past[PAST_KEY % i] = results[PRESENT_KEY % i]
            past[PAST_VALUE % i] = results[PRESENT_VALUE % i]
        ids = np.asarray([[token]], dtype=np.int64)
        total += 1
    return out


def greedy_onnxruntime(model_path: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, *,
                       eos_token_id: int | None = None, threads: int | None = None) -> Greedy:
    """Greedy generation by plain ONNX Runtime (CPU provider) over the dynamic model: the prompt in one run, then one
    token a run, each run's present fed back as the next run's past. Stops after ``eos_token_id`` (kept)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    ports = _ports({i.name: i.shape for i in session.get_inputs()})
    names = [o.name for o in session.get_outputs()]

    def step(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds)))

    return _greedy(step, ports, prompt_ids, max_new_tokens, eos_token_id)


def greedy_openvino(model_path: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, *,
                    eos_token_id: int | None = None, threads: int | None = None) -> Greedy:
    """The same loop on OpenVINO's CPU plugin, computing in f32 (``INFERENCE_PRECISION_HINT``: its default on a
    bf16-capable CPU is bf16, which changes tokens at near-ties)."""
    import openvino as ov

    properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if threads is not None:
        properties["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(str(model_path), "CPU", properties)
    ports = _ports({p.any_name: [d.get_length() if d.is_static else -1 for d in p.get_partial_shape()]
                    for p in compiled.inputs})
    request = compiled.create_infer_request()
    outputs = [(o, o.any_name) for o in compiled.outputs]

    def step(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = request.infer(feeds)
        return {name: np.array(results[port]) for port, name in outputs}

    return _greedy(step, ports, prompt_ids, max_new_tokens, eos_token_id)


def genai_model(folder: str | Path, threads: int | None = None) -> Any:
    """onnxruntime-genai's ``og.Model`` over the decoder's folder (``threads``: the session's intra-op threads)."""
    og: Any = importlib.import_module("onnxruntime_genai")
    if threads is None:
        return og.Model(str(folder))
    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    return og.Model(config)


def greedy_genai(model: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """onnxruntime-genai's greedy search: the new tokens (up to its eos, which it keeps, or ``max_new_tokens``).
    ``model``: a folder with genai_config.json, or an ``og.Model`` (`genai_model`)."""
    og: Any = importlib.import_module("onnxruntime_genai")
    if isinstance(model, (str, Path)):
        model = genai_model(model)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt_ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(prompt_ids):]]
