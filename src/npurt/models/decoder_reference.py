"""Greedy generation by the engines used directly, on the decoders of `npurt.models.decoders`: what npurt's
``decoder`` option and ``npurt.Generator`` are checked against (tests) and timed against (benchmarks).

- `OnnxRuntimeDecoder` / `greedy_onnxruntime`: plain ONNX Runtime (CPU provider) over the dynamic model, the KV
  cache growing (each run's present fed back as the next run's past): the new tokens, the logits each was picked
  from, each step's top-2 logit gap, and when each token was known. Any form of `npurt.models.decoder_forms`: the
  past in the export's own float type (float16 in fp16 exports), ``use_cache_branch`` fed where the model has it
  (optimum's merged decoder: false for the prompt, true after).
- `SharedBufferDecoder`: plain ONNX Runtime over a GroupQueryAttention (builder form) export with past and present
  one buffer of max_length rows written in place, as onnxruntime-genai runs it, with the logits.
- `OpenVinoDecoder` / `greedy_openvino`: the same loop on OpenVINO's CPU plugin at ``INFERENCE_PRECISION_HINT`` f32.
- `GenaiDecoder` / `greedy_genai`: onnxruntime-genai's own greedy search over the model's folder
  (``genai_config.json``).
- `agreeing_prefix`: how many leading tokens two engines must agree on: all, or those before the reference's first
  step whose top-2 gap is under a tolerance (engines at f32 differ by ~1e-5: a near-tie may pick either token).

The engines are imported when called (onnxruntime-genai is a test extra).
"""

from __future__ import annotations

import importlib
import json
import time
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
from .optimum_forms import USE_CACHE_BRANCH

NEAR_TIE = 1e-3  # the top-2 logit gap under which a greedy step may pick either token


@dataclass
class Greedy:
    """A greedy run: the new tokens, and per step the logits (float32 [vocab]) each was picked from and their top-2
    gap (largest minus second largest; onnxruntime-genai's runs have neither); ``start`` and ``times``: the
    ``time.perf_counter()`` when the run began and when each token was known."""

    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    start: float = 0.0
    times: list[float] = field(default_factory=list)

    def record(self, logits: np.ndarray) -> int:
        """A greedy step: the id picked from ``logits`` (float32 [vocab]), kept with them, their top-2 gap and when."""
        token = int(np.argmax(logits))
        self.times.append(time.perf_counter())
        self.tokens.append(token)
        self.logits.append(logits)
        self.gaps.append(top2_gap(logits))
        return token

    @property
    def time_to_first_token_s(self) -> float:
        """From the start of the run (the prompt given) to the first new token."""
        return self.times[0] - self.start

    @property
    def decode_tokens_per_s(self) -> float:
        """The tokens after the first over the time after the first: the decode steps' rate (nan under 2 tokens)."""
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return float("nan")
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])


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
    kv_dtype: type[np.floating[Any]] = np.float32  # the past's element type (float16 in fp16 exports)
    use_cache_branch: bool = False  # optimum's merged decoder: the bool input choosing the with-past branch


def _ports(inputs: dict[str, Sequence[Any]], kv_dtype: type[np.floating[Any]], model_path: str | Path) -> _Ports:
    """The KV layout read from the model's inputs {name: shape}; a dim the graph names (the model builder's
    ``kv_cache_dim``) from the configs beside the model, as onnxruntime-genai reads it (genai_config.json's
    head_size)."""
    from ..generate.folder import read_configs

    layers = sum(1 for name in inputs if name.startswith("past_key_values.") and name.endswith(".key"))
    if layers == 0 or PAST_KEY % 0 not in inputs:
        raise ValueError(f"not a decoder with {PAST_KEY % 0!r}: inputs {sorted(inputs)}")
    shape = inputs[PAST_KEY % 0]
    dims = [d if isinstance(d, int) and d > 0 else None for d in (shape[1], shape[3])]
    if None in dims:
        given = read_configs(Path(model_path).parent).cache_dims
        dims = [d if d is not None else given[what][0] for d, what in zip(dims, ("kv_heads", "head_dim"))]
    return _Ports(layers, int(dims[0] or 0), int(dims[1] or 0), POSITION_IDS in inputs, kv_dtype,
                  USE_CACHE_BRANCH in inputs)


def _greedy(step: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], ports: _Ports,
            prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> Greedy:
    if not prompt_ids:
        raise ValueError("an empty prompt")
    out = Greedy(start=time.perf_counter())
    past: dict[str, np.ndarray] = {}
    for i in range(ports.layers):
        for name in (PAST_KEY % i, PAST_VALUE % i):
            past[name] = np.zeros((1, ports.kv_heads, 0, ports.head_dim), dtype=ports.kv_dtype)
    ids = np.asarray([prompt_ids], dtype=np.int64)
    total = ids.shape[1]
    for _ in range(max_new_tokens):
        feeds: dict[str, np.ndarray] = {INPUT_IDS: ids, ATTENTION_MASK: np.ones((1, total), dtype=np.int64), **past}
        if ports.has_position_ids:
            feeds[POSITION_IDS] = np.arange(total - ids.shape[1], total, dtype=np.int64)[None, :]
        if ports.use_cache_branch:
            feeds[USE_CACHE_BRANCH] = np.array([total > ids.shape[1]])
        results = step(feeds)
        token = out.record(np.array(results[LOGITS][0, -1], dtype=np.float32))
        if token == eos_token_id:
            break
        past = {}
        for i in range(ports.layers):
            past[PAST_KEY % i] = results[PRESENT_KEY % i]
            past[PAST_VALUE % i] = results[PRESENT_VALUE % i]
        ids = np.asarray([[token]], dtype=np.int64)
        total += 1
    return out


class OnnxRuntimeDecoder:
    """Plain ONNX Runtime (CPU provider) over the dynamic model, one session for many runs: the prompt in one run,
    then one token a run, each run's present fed back as the next run's past (numpy arrays, the KV growing)."""

    def __init__(self, model_path: str | Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        past_type = next((i.type for i in inputs if i.name == PAST_KEY % 0), "")
        self.ports = _ports({i.name: i.shape for i in inputs},
                            np.float16 if past_type == "tensor(float16)" else np.float32, model_path)
        self.names = [o.name for o in self.session.get_outputs()]

    def step(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, feeds)))

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *,
                 eos_token_id: int | None = None) -> Greedy:
        """Greedy tokens; stops after ``eos_token_id`` (kept)."""
        return _greedy(self.step, self.ports, prompt_ids, max_new_tokens, eos_token_id)


class SharedBufferDecoder:
    """Plain ONNX Runtime over a GroupQueryAttention export (the builder form) as onnxruntime-genai runs it with
    ``past_present_share_buffer``: each layer's past and present bound (IOBinding) to one buffer [1, kv_heads,
    ``max_length``, head_dim] that the attention writes the new rows into in place; the mask is ``total`` ones, so
    that seqlens_k = total - 1 and total_sequence_length = total. Unlike onnxruntime-genai it returns the logits."""

    def __init__(self, model_path: str | Path, max_length: int, threads: int | None = None) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = threads
        self.ort = ort
        self.session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        past_type = next((i.type for i in inputs if i.name == PAST_KEY % 0), "")
        self.ports = _ports({i.name: i.shape for i in inputs},
                            np.float16 if past_type == "tensor(float16)" else np.float32, model_path)
        if self.ports.has_position_ids or self.ports.use_cache_branch:
            raise ValueError("SharedBufferDecoder runs GroupQueryAttention exports (no position_ids input)")
        self.max_length = max_length
        self.vocab = int(next(o.shape[-1] for o in self.session.get_outputs() if o.name == LOGITS))
        self.buffers: dict[str, np.ndarray] = {}  # the last run's cache, by present name: [1, kv, max_length, D]

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *,
                 eos_token_id: int | None = None) -> Greedy:
        """Greedy tokens; stops after ``eos_token_id`` (kept) or at ``max_length`` tokens in all."""
        if not prompt_ids:
            raise ValueError("an empty prompt")
        if len(prompt_ids) + max_new_tokens > self.max_length:
            raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens exceed max_length {self.max_length}")
        out = Greedy(start=time.perf_counter())
        p = self.ports
        binding = self.session.io_binding()
        self.buffers.clear()
        for i in range(p.layers):
            for past, present in ((PAST_KEY % i, PRESENT_KEY % i), (PAST_VALUE % i, PRESENT_VALUE % i)):
                self.buffers[present] = np.zeros((1, p.kv_heads, self.max_length, p.head_dim), dtype=p.kv_dtype)
                buffer = self.ort.OrtValue.ortvalue_from_numpy(self.buffers[present])  # the same memory
                binding.bind_ortvalue_input(past, buffer)
                binding.bind_ortvalue_output(present, buffer)
        ids = np.asarray([prompt_ids], dtype=np.int64)
        total = ids.shape[1]
        for _ in range(max_new_tokens):
            binding.bind_cpu_input(INPUT_IDS, ids)
            binding.bind_cpu_input(ATTENTION_MASK, np.ones((1, total), dtype=np.int64))
            all_logits = np.empty((1, ids.shape[1], self.vocab), dtype=p.kv_dtype)  # filled in place by the run
            binding.bind_ortvalue_output(LOGITS, self.ort.OrtValue.ortvalue_from_numpy(all_logits))
            self.session.run_with_iobinding(binding)
            token = out.record(np.array(all_logits[0, -1], dtype=np.float32))
            if token == eos_token_id:
                break
            ids = np.asarray([[token]], dtype=np.int64)
            total += 1
        return out


class OpenVinoDecoder:
    """The same loop on OpenVINO's CPU plugin, computing in f32 (``INFERENCE_PRECISION_HINT``: its default on a
    bf16-capable CPU is bf16, which changes tokens at near-ties); one compiled model and request for many runs."""

    def __init__(self, model_path: str | Path, threads: int | None = None,
                 properties: dict[str, Any] | None = None) -> None:
        import openvino as ov

        # int4 exports: DYNAMIC_QUANTIZATION_GROUP_SIZE 0 keeps the activations float (by default the plugin
        # quantizes them to int8 for MatMulNBits: logits move by ~0.1)
        properties = {"INFERENCE_PRECISION_HINT": "f32", **(properties or {})}
        if threads is not None:
            properties["INFERENCE_NUM_THREADS"] = threads
        compiled = ov.Core().compile_model(str(model_path), "CPU", properties)
        past_type = next((p.get_element_type() for p in compiled.inputs if PAST_KEY % 0 in p.get_names()), None)
        self.ports = _ports({p.any_name: [d.get_length() if d.is_static else -1 for d in p.get_partial_shape()]
                             for p in compiled.inputs}, np.float16 if past_type == ov.Type.f16 else np.float32,
                            model_path)
        self.request = compiled.create_infer_request()
        self.outputs = [(o, o.any_name) for o in compiled.outputs]

    def step(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.request.infer(feeds)
        return {name: np.array(results[port]) for port, name in self.outputs}

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, *,
                 eos_token_id: int | None = None) -> Greedy:
        """Greedy tokens; stops after ``eos_token_id`` (kept)."""
        return _greedy(self.step, self.ports, prompt_ids, max_new_tokens, eos_token_id)


class GenaiDecoder:
    """onnxruntime-genai's own greedy search over the decoder's folder (its genai_config.json: names, eos, context
    length), one ``og.Model`` for many runs; ``threads``: the session's intra-op threads."""

    def __init__(self, folder: str | Path, threads: int | None = None) -> None:
        self.og: Any = importlib.import_module("onnxruntime_genai")
        if threads is None:
            self.model = self.og.Model(str(folder))
        else:
            config = self.og.Config(str(folder))
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
            self.model = self.og.Model(config)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Greedy:
        """The new tokens (up to the config's eos, which onnxruntime-genai drops, or ``max_new_tokens``), with the
        time each was known (no logits)."""
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
        out = Greedy(start=time.perf_counter())
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(np.asarray([prompt_ids], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
            if generator.is_done() and len(generator.get_sequence(0)) == len(prompt_ids) + len(out.tokens):
                break  # stopped at eos: no new token
            out.times.append(time.perf_counter())
            out.tokens.append(int(generator.get_next_tokens()[0]))
        return out


def greedy_onnxruntime(model_path: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, *,
                       eos_token_id: int | None = None, threads: int | None = None) -> Greedy:
    """`OnnxRuntimeDecoder`'s greedy run, once."""
    return OnnxRuntimeDecoder(model_path, threads).generate(prompt_ids, max_new_tokens, eos_token_id=eos_token_id)


def greedy_openvino(model_path: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, *,
                    eos_token_id: int | None = None, threads: int | None = None) -> Greedy:
    """`OpenVinoDecoder`'s greedy run, once."""
    return OpenVinoDecoder(model_path, threads).generate(prompt_ids, max_new_tokens, eos_token_id=eos_token_id)


def greedy_genai(model: str | Path | GenaiDecoder, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """onnxruntime-genai's greedy tokens (`GenaiDecoder`; ``model``: one, or the decoder's folder)."""
    decoder = model if isinstance(model, GenaiDecoder) else GenaiDecoder(model)
    return decoder.generate(prompt_ids, max_new_tokens).tokens
