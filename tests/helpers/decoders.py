"""Decoders for the tests and the references they are checked against (issue 36).

The models come from `npurt.models.decoders` (built on demand into a folder; nothing is committed); the greedy
loops of the engines used directly from `npurt.models.decoder_reference` (benchmarks/generate.py uses them too).
Here besides: a numpy forward pass written from the weights alone (the graph checked against the arithmetic it
means, not only engine against engine), and `assert_tokens_agree`, the comparison every greedy test makes.

    folder = decoder_folder(tmp_path, "gqa")                      # model.onnx + genai_config.json
    ref = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, 64, eos_token_id=EOS_TOKEN_ID)
    assert_tokens_agree(npurt_tokens, ref, "npurt on OPENVINO")   # equal up to the first near-tie
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from npurt.models import decoder_forms
from npurt.models.decoder_reference import (
    NEAR_TIE,
    GenaiDecoder,
    Greedy,
    OnnxRuntimeDecoder,
    OpenVinoDecoder,
    agreeing_prefix,
    greedy_genai,
    greedy_onnxruntime,
    greedy_openvino,
    top2_gap,
)
from npurt.models.decoders import (
    EOS_TOKEN_ID,
    MODEL_FILE,
    RMS_EPS,
    SHAPES,
    TEST_SHAPES,
    DecoderShape,
    build_decoder,
    make_weights,
    rope_caches,
    shape_of,
)
from tests.helpers.missing import require_module

__all__ = ["EOS_TOKEN_ID", "MODEL_FILE", "NEAR_TIE", "NEW_TOKENS", "PROMPT", "SHAPES", "TEST_SHAPES", "DecoderShape",
           "GenaiDecoder", "Greedy", "OnnxRuntimeDecoder", "OpenVinoDecoder", "agreeing_prefix", "assert_tokens_agree",
           "build_decoder", "decoder_folder", "greedy_genai", "greedy_onnxruntime", "greedy_openvino", "numpy_logits",
           "require_genai", "top2_gap"]

PROMPT = [1, 17, 42, 99, 7, 300]  # ids below every test shape's vocabulary
NEW_TOKENS = 64


def require_genai() -> ModuleType:
    """onnxruntime-genai (the test extra): a skip locally where it is missing, a failure in CI."""
    return require_module("onnxruntime_genai", "the decoder references need onnxruntime-genai (extra 'test')")


def decoder_folder(root: Path, shape: DecoderShape | str, seed: int = 0, **options: object) -> Path:
    """A folder under ``root`` holding the decoder's model.onnx and genai_config.json (built once per folder name;
    ``options``: build_decoder's keywords, e.g. external_data=True, eos_token_id=N)."""
    label = shape if isinstance(shape, str) else "custom"
    suffix = "".join(f"-{k}={v}" for k, v in sorted(options.items()))
    folder = Path(root) / f"{label}-seed{seed}{suffix}"
    if not (folder / MODEL_FILE).is_file():
        build_decoder(folder, shape, seed, **options)  # type: ignore[arg-type]
    return folder


def form_folder(root: Path, name: str, form: str, **options: object) -> Path:
    """The preset ``name`` in export ``form`` under ``root`` (built once per folder name; ``options``:
    build_decoder_form's)."""
    suffix = "".join(f"-{k}={getattr(v, 'label', v)}" for k, v in sorted(options.items()))
    folder = Path(root) / f"{name}-{form}{suffix}"
    if not (folder / decoder_forms.model_file(form)).is_file():
        decoder_forms.build_decoder_form(folder, name, form=form, **options)  # type: ignore[arg-type]
    return folder


def assert_tokens_agree(got: Sequence[int], reference: Greedy, what: str, tolerance: float = NEAR_TIE) -> int:
    """``got`` equals the reference's tokens up to its first step whose top-2 logit gap is under ``tolerance`` (a
    near-tie may pick either token; all the tokens where there is none); returns how many were compared."""
    n = agreeing_prefix(reference, tolerance)
    assert list(got[:n]) == reference.tokens[:n], (
        f"{what}: tokens differ from the reference within the first {n} (before any near-tie under {tolerance}):\n"
        f"  got       {list(got[:n])}\n  reference {reference.tokens[:n]}")
    if n == len(reference.tokens):
        assert len(got) == n, f"{what}: {len(got)} tokens, the reference made {n}"
    return n


def numpy_logits(shape: DecoderShape | str, seed: int, ids: Sequence[int], window: int | None = None) -> np.ndarray:
    """The decoder's logits [len(ids), vocab] for one sequence from position 0 (no past), in float64 numpy, computed
    from the weights as a Llama decoder means them: RMSNorm, rotate-half RoPE, grouped-query causal attention,
    SwiGLU. ``window``: a sliding window, query q seeing the ``window`` keys q - window + 1 .. q, its own included
    (GroupQueryAttention's local_window_size, measured)."""
    shape = shape_of(shape) if isinstance(shape, str) else shape
    w = {k: v.astype(np.float64) for k, v in make_weights(shape, seed).items()}
    cos, sin = (c.astype(np.float64)[: len(ids)] for c in rope_caches(shape))  # [S, D/2]
    s, d = len(ids), shape.head_dim

    def rms(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * weight

    def rotate(x: np.ndarray) -> np.ndarray:  # [N, S, D]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    causal = np.triu(np.full((s, s), -np.inf), k=1)
    if window is not None:
        causal += np.tril(np.full((s, s), -np.inf), k=-window)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rotate((h @ w[p + "self_attn.q_proj.weight"]).reshape(s, shape.heads, d).transpose(1, 0, 2))
        k = rotate((h @ w[p + "self_attn.k_proj.weight"]).reshape(s, shape.kv_heads, d).transpose(1, 0, 2))
        v = (h @ w[p + "self_attn.v_proj.weight"]).reshape(s, shape.kv_heads, d).transpose(1, 0, 2)
        k, v = (np.repeat(t, shape.heads // shape.kv_heads, axis=0) for t in (k, v))  # query head j uses j // rep
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d) + causal
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        x = x + (probs @ v).transpose(1, 0, 2).reshape(s, -1) @ w[p + "self_attn.o_proj.weight"]
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"]
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "mlp.up_proj.weight"])) @ w[p + "mlp.down_proj.weight"]
    logits: np.ndarray = rms(x, w["model.norm.weight"]) @ w["lm_head.weight"]
    return logits
