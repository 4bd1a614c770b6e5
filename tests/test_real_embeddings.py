"""all-MiniLM-L6-v2, a real embedding model built from its PyPI wheel (tools/real_models, issue 59's fixture): its
two ONNX folders (sentence-transformers' ONNX backend, optimum's feature-extraction export) run through npurt give
sentence-transformers' torch embeddings: the token embeddings of the first mean-pooled over the mask and normalised,
the second's own pooled output; VAIML exactly as raw ONNX Runtime, OpenVINO at f32 within 1e-4. The tokenizer as
sentence-transformers applies it: truncation at the model's max_seq_length (256), not tokenizer.json's 128."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from npurt import RunnerFactory
from tests.helpers.real_models import folder, reference

TOLERANCE = {"VAIML": 1e-5, "OPENVINO": 1e-4}


def _model_file(name: str):
    root = folder(name)
    return root / "onnx" / "model.onnx" if (root / "onnx" / "model.onnx").is_file() else root / "model.onnx"


def _feeds(name: str, text: str, max_length: int, inputs: set[str]) -> dict[str, np.ndarray]:
    tokenizer = Tokenizer.from_file(str(folder(name) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)  # sentence-transformers' max_seq_length, over tokenizer.json's 128
    encoded = tokenizer.encode(text)
    feeds = {"input_ids": np.array([encoded.ids], np.int64),
             "attention_mask": np.array([encoded.attention_mask], np.int64),
             "token_type_ids": np.array([encoded.type_ids], np.int64)}
    return {k: v for k, v in feeds.items() if k in inputs}


def _embedding(outputs: dict[str, np.ndarray], mask: np.ndarray) -> np.ndarray:
    if "sentence_embedding" in outputs:
        return np.asarray(outputs["sentence_embedding"][0], np.float64)
    tokens = next(v for v in outputs.values() if v.ndim == 3)[0].astype(np.float64)  # [S, 384]
    pooled = (tokens * mask[0, :, None]).sum(0) / max(mask.sum(), 1)
    return pooled / max(np.linalg.norm(pooled), 1e-12)


@pytest.mark.parametrize("backend", ["VAIML", "OPENVINO"])
@pytest.mark.parametrize("name", ["minilm-st", "minilm-optimum"])
def test_embeddings_equal_sentence_transformers(name, backend):
    ref = reference(name)
    path = _model_file(name)
    options = {"device": "CPU", **({"inference_precision": "f32"} if backend == "OPENVINO" else {})}
    raw = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in raw.get_inputs()}
    with RunnerFactory.create_runner(backend, path, options) as runner:
        for text, want, count in zip(ref["texts"], ref["embeddings"], ref["tokens"]):
            feeds = _feeds(name, text, ref["max_seq_length"], inputs)
            assert feeds["input_ids"].shape[1] == count  # truncated where sentence-transformers truncates
            got = runner.run(feeds)
            embedding = _embedding(got, feeds["attention_mask"])
            assert np.abs(embedding - np.asarray(want)).max() <= TOLERANCE[backend], (name, backend, text[:40])
            if backend == "VAIML":  # npurt's ONNX Runtime backend gives the engine's own bits
                plain = dict(zip([o.name for o in raw.get_outputs()], raw.run(None, feeds)))
                for key, value in got.items():
                    np.testing.assert_array_equal(value, plain[key])


@pytest.mark.parametrize("backend", ["VAIML", "OPENVINO"])  # (ONNXRUNTIME: tests/test_embed.py)
@pytest.mark.parametrize("name", ["minilm-st", "minilm-optimum"])
def test_embedder_equals_sentence_transformers(name, backend):
    """npurt.Embedder over each folder, all texts in one call (ragged, sorted, padded to the batch's longest): the
    reference's embeddings within 1e-5 (OpenVINO: cosine >= 0.99999), truncated where sentence-transformers
    truncates. The sentence-transformers folder says its maximum length itself (tokenizer_config.json's
    model_max_length, 256: the ONNX save writes no max_seq_length); optimum's export says 512 (model_max_length,
    bounded by max_position_embeddings), so the reference's 256 is passed there."""
    from npurt import Embedder

    ref = reference(name)
    want = np.asarray(ref["embeddings"], np.float64)
    given = {} if name == "minilm-st" else {"max_length": ref["max_seq_length"]}
    with Embedder(folder(name), backend, "CPU", **given) as embedder:
        assert embedder.max_length == ref["max_seq_length"] and embedder.dimension == ref["dimension"]
        assert [len(ids) for ids in embedder.tokenize(ref["texts"])] == ref["tokens"]
        got = embedder.encode(ref["texts"]).astype(np.float64)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.99999, (name, backend, cosine.min())
    assert np.abs(got - want).max() <= (1e-5 if backend != "OPENVINO" else 1e-4), (name, backend)
    if name == "minilm-optimum" and backend == "VAIML":
        with Embedder(folder(name), backend, "CPU") as own:
            assert own.max_length == 512
            longest = int(np.argmax(ref["tokens"]))
            assert len(own.tokenize(ref["texts"][longest])[0]) > ref["max_seq_length"]


def test_embedder_buckets_equal_sentence_transformers():
    """Pinned shapes, verified at load, on the real model: the reference's embeddings, bucket by bucket."""
    from npurt import Embedder

    ref = reference("minilm-st")
    with Embedder(folder("minilm-st"), "VAIML", "CPU", buckets=[(4, 16), (2, 256)]) as embedder:
        assert all(c.ok for c in embedder.bucket_checks) and len(embedder.bucket_checks) == 2
        got = embedder.encode(ref["texts"])
        assert {b.shape for b in embedder.last_batches} <= {(4, 16), (1, 16), (2, 256), (1, 256)}
        assert all(b.bucket for b in embedder.last_batches)
    assert np.abs(got - np.asarray(ref["embeddings"], np.float32)).max() <= 1e-5
