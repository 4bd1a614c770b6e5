"""npurt.Embedder on random-weight BERT folders in both forms (npurt.models.bert), against the engine used directly:
each text tokenized by HF tokenizers itself, run alone (unpadded) in a plain ONNX Runtime session and pooled here
with numpy, row by row. So ragged, padded, batched and bucketed runs through npurt must give what each text gives
alone (the sentence-transformers side is tests/test_real_embeddings.py's, on the real model)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from npurt import Embedder
from npurt.embed import read_folder
from npurt.models.bert import write_bert
from npurt.models.tokenizer_files import corpus

WORDS = " ".join(corpus(lines=400, seed=3)).split()


def ragged_texts(count: int = 12, longest: int = 300, seed: int = 1) -> list[str]:
    """Texts of about 1 to ``longest`` words (more tokens), one of them empty, one in capitals."""
    rng = np.random.default_rng(seed)
    sizes = sorted({1, longest, *rng.integers(1, longest, count - 3).tolist()})
    texts = [" ".join(WORDS[i * 7 % 1000: i * 7 % 1000 + n]) for i, n in enumerate(sizes)]
    return ["", texts[0].upper(), *texts[1:]]


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory) -> Path:
    return write_bert(tmp_path_factory.mktemp("bert") / "st", "sentence-transformers",
                      prompts={"query": "query: ", "passage": "passage: "})


@pytest.fixture(scope="module")
def optimum_folder(tmp_path_factory) -> Path:
    return write_bert(tmp_path_factory.mktemp("bert") / "optimum", "optimum")


def variant(folder: Path, tmp_path: Path, **changes: dict) -> Path:
    """A copy of ``folder`` with JSON files changed: {relative path: {key: value}} (a value None removes it)."""
    out = tmp_path / f"{folder.name}-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(folder, out)
    for name, edits in changes.items():
        path = out / (name if name.endswith(".json") else f"{name}.json")
        data = json.loads(path.read_text()) if path.is_file() else {}
        for key, value in edits.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        path.write_text(json.dumps(data))
    return out


# ------------------------------------------------------------------------------------- the reference, row by row
class Alone:
    """Each text tokenized by HF tokenizers, run alone in plain ONNX Runtime, pooled with numpy."""

    def __init__(self, folder: Path, max_length: int) -> None:
        onnx_file = folder / "onnx" / "model.onnx" if (folder / "onnx").is_dir() else folder / "model.onnx"
        self.session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def outputs(self, ids: list[int]) -> dict[str, np.ndarray]:
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64),
                 "token_type_ids": np.zeros((1, len(ids)), np.int64)}
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, {k: v for k, v in feeds.items() if k in self.inputs})))

    def pooled(self, text: str, modes=("mean",), normalize=True, skip: int = 0) -> np.ndarray:
        out = self.outputs(self.ids(text))
        if "sentence_embedding" in out:
            return out["sentence_embedding"][0].astype(np.float64)
        tokens = next(v for v in out.values() if v.ndim == 3)[0].astype(np.float64)
        kept = tokens[skip:]
        weights = np.arange(skip + 1, len(tokens) + 1, dtype=np.float64)[:, None]  # position i weighs i + 1
        pooled = {"cls": kept[0], "max": kept.max(0), "mean": kept.mean(0),
                  "mean_sqrt_len_tokens": kept.sum(0) / np.sqrt(len(kept)),
                  "weightedmean": (kept * weights).sum(0) / weights.sum(), "lasttoken": tokens[-1]}
        parts = [pooled[mode] for mode in modes]
        vector = np.concatenate(parts)
        return vector / np.linalg.norm(vector) if normalize else vector


def assert_close(got: np.ndarray, want: np.ndarray, tolerance: float = 1e-5) -> None:
    """Within ``tolerance`` of the reference's scale (relative where vectors are not unit ones), cosine >= 0.99999."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= tolerance * scale, np.abs(got - want).max()
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosine.min() >= 0.99999


# ------------------------------------------------------------------------------------------------- the folder
def test_both_forms_are_read_as_sentence_transformers_reads_them(st_folder, optimum_folder, tmp_path):
    st = read_folder(st_folder)
    assert (st.form, st.output, st.pooled_in_graph, st.normalize) == ("sentence-transformers", "last_hidden_state",
                                                                      False, True)
    assert st.inputs == ("input_ids", "attention_mask", "token_type_ids") and st.pooling.modes == ("mean",)
    assert st.prompts == {"query": "query: ", "passage": "passage: "} and st.dimension == 32
    opt = read_folder(optimum_folder / "model.onnx")  # (the ONNX file given: its folder is read)
    assert (opt.form, opt.output, opt.pooled_in_graph) == ("optimum", "sentence_embedding", True)
    assert opt.inputs == ("input_ids", "attention_mask")  # no token_type_ids: none is fed
    # the maximum length: max_seq_length, else model_max_length bounded by max_position_embeddings
    assert st.max_length == 512 and st.max_length_source == "tokenizer_config.json model_max_length"
    given = variant(st_folder, tmp_path, sentence_bert_config={"max_seq_length": 40}, tokenizer_config={
        "model_max_length": 64})
    assert read_folder(given).max_length == 40
    assert read_folder(variant(st_folder, tmp_path, tokenizer_config={"model_max_length": 64})).max_length == 64
    unbounded = read_folder(variant(st_folder, tmp_path, tokenizer_config={"model_max_length": 10**30}))
    assert unbounded.max_length == 512 and unbounded.max_length_source == "config.json max_position_embeddings"
    legacy = variant(st_folder, tmp_path, **{"1_Pooling/config.json": {
        "pooling_mode": None, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}})
    assert read_folder(legacy).pooling.modes == ("cls", "mean")


def test_folders_npurt_cannot_run_are_refused_saying_why(st_folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="no embedding model folder"):
        read_folder(tmp_path / "nothing")
    dense = tmp_path / "dense"
    shutil.copytree(st_folder, dense)
    modules = json.loads((dense / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="module Dense .* is not run by npurt.Embedder"):
        read_folder(dense)
    (dense / "onnx" / "model.onnx").rename(dense / "onnx" / "model_O4.onnx")
    with pytest.raises(FileNotFoundError, match="model_O4.onnx: pass model_file="):
        read_folder(dense)
    bad_mode = variant(st_folder, tmp_path, **{"1_Pooling/config.json": {"pooling_mode": "median"}})
    with pytest.raises(ValueError, match="pooling mode 'median'"):
        read_folder(bad_mode)


# ------------------------------------------------------------------------------------------ exact, every backend
@pytest.mark.parametrize("backend", ["VAIML", "ONNXRUNTIME", "OPENVINO"])
@pytest.mark.parametrize("form", ["sentence-transformers", "optimum"])
def test_ragged_batches_equal_each_text_run_alone(form, backend, st_folder, optimum_folder):
    """Texts of 2 to 300+ tokens, sorted and cut into padded batches by a small token budget, on each backend: each
    embedding equals its text run alone in raw ONNX Runtime (tokenizer.json's own truncation at 128 overridden)."""
    folder = st_folder if form == "sentence-transformers" else optimum_folder
    texts = ragged_texts()
    alone = Alone(folder, 512)
    with Embedder(folder, backend, "CPU", batch_tokens=1500) as embedder:
        assert embedder.tokenize(texts) == [alone.ids(t) for t in texts]
        assert max(len(i) for i in embedder.tokenize(texts)) > 300  # past tokenizer.json's 128
        if form == "optimum" and backend == "VAIML":  # truncation at max_length (512), and without it
            long = " ".join(WORDS[:400])
            assert len(embedder.tokenize(long)[0]) == 512 and embedder.tokenize(long)[0][-1] == 3  # [SEP] kept
            assert embedder.tokenize(long, truncate=False)[0] == Alone(folder, 10**6).ids(long)
            assert len(embedder.tokenize(long, truncate=False)[0]) > 512
        got = embedder.encode(texts)
        assert got.dtype == np.float32 and got.shape == (len(texts), 32) and embedder.dimension == 32
        batches = embedder.last_batches
        assert len(batches) > 1 and sorted(i for b in batches for i in b.rows) == list(range(len(texts)))
        assert all(b.padded_tokens <= 1500 or len(b.rows) == 1 for b in batches)
        assert embedder.runner.stats["copies"] == 0  # the batches' arrays reach the engine as they are
        assert_close(got, np.stack([alone.pooled(t) for t in texts]), 1e-5 if backend != "OPENVINO" else 1e-4)


@pytest.mark.parametrize("modes,normalize", [(("cls",), False), (("max",), True), (("mean_sqrt_len_tokens",), False),
                                             (("weightedmean",), True), (("lasttoken",), True),
                                             (("cls", "mean"), False)])
def test_each_pooling_mode(modes, normalize, st_folder, tmp_path):
    changes = {"1_Pooling/config.json": {"pooling_mode": list(modes)}}
    folder = variant(st_folder, tmp_path, **changes)
    if not normalize:
        (folder / "modules.json").write_text(json.dumps(json.loads((folder / "modules.json").read_text())[:2]))
    texts = ragged_texts(8, 120)
    with Embedder(folder, "ONNXRUNTIME", "CPU") as embedder:
        got = embedder.encode(texts)
        assert got.shape == (len(texts), 32 * len(modes))
    alone = Alone(folder, 512)
    assert_close(got, np.stack([alone.pooled(t, modes, normalize) for t in texts]))


def test_prompts_named_default_given_and_left_out_of_the_pooling(st_folder, tmp_path):
    folder = variant(st_folder, tmp_path, **{"1_Pooling/config.json": {"include_prompt": False},
                                             "config_sentence_transformers.json": {"default_prompt_name": "query"}})
    texts = ragged_texts(5, 40)
    alone = Alone(folder, 512)
    query_skip = len(alone.ids("query: ")) - 1  # [CLS] and the prompt's tokens, not its [SEP]
    with Embedder(folder, "ONNXRUNTIME", "CPU") as embedder:
        assert embedder.tokenize("a b")[0] == alone.ids("query: a b")  # the default prompt
        assert_close(embedder.encode(texts), np.stack([alone.pooled("query: " + t, skip=query_skip) for t in texts]))
        passage_skip = len(alone.ids("passage: ")) - 1
        assert_close(embedder.encode(texts, prompt_name="passage"),
                     np.stack([alone.pooled("passage: " + t, skip=passage_skip) for t in texts]))
        assert_close(embedder.encode(texts, prompt="", prompt_name="passage"),  # prompt wins, as in s-t
                     np.stack([alone.pooled(t) for t in texts]))
        with pytest.raises(ValueError, match="prompt_name 'nope'.*'query', 'passage'"):
            embedder.encode(texts, prompt_name="nope")


def test_truncate_dim_normalize_and_quantized_precisions(st_folder):
    texts = ragged_texts(10, 60)
    with Embedder(st_folder, "ONNXRUNTIME", "CPU") as embedder:
        full = embedder.encode(texts)
        cut = embedder.encode(texts, truncate_dim=8)
        np.testing.assert_array_equal(cut, full[:, :8])  # Matryoshka: not renormalised
        unit = embedder.encode(texts, truncate_dim=8, normalize=True)
        np.testing.assert_allclose(unit, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-7)
        raw = embedder.encode(texts, normalize=False)  # the folder's Normalize module left out
        np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), full, atol=1e-6)
        assert np.linalg.norm(raw, axis=1).min() > 1.5
        # quantize_embeddings: ranges per dimension from the embeddings themselves, 255 steps, floor
        low, high = full.min(0), full.max(0)
        steps = (high - low) / 255
        levels = np.clip(np.floor((full - low) / np.where(steps == 0, 1, steps)), 0, 255)
        np.testing.assert_array_equal(embedder.encode(texts, precision="uint8"), levels.astype(np.uint8))
        np.testing.assert_array_equal(embedder.encode(texts, precision="int8"), (levels - 128).astype(np.int8))
        bits = np.array([[int("".join("1" if v > 0 else "0" for v in row[k:k + 8]), 2) for k in range(0, 32, 8)]
                         for row in full])
        np.testing.assert_array_equal(embedder.encode(texts, precision="ubinary"), bits.astype(np.uint8))
        np.testing.assert_array_equal(embedder.encode(texts, precision="binary"), (bits - 128).astype(np.int8))
        assert embedder.encode(texts[0]).shape == (32,)  # a single text: one vector, as in s-t
        assert embedder.encode([]).shape == (0, 32) and embedder.encode([], precision="ubinary").shape == (0, 4)


def test_normalize_false_is_refused_where_the_graph_pools(optimum_folder):
    with Embedder(optimum_folder, "ONNXRUNTIME", "CPU") as embedder:
        with pytest.raises(ValueError, match="pools"):
            embedder.encode(["a"], normalize=False)


# -------------------------------------------------------------------------------------------------- buckets
def test_bucketed_padded_runs_equal_unpadded_runs(st_folder):
    """Pinned [batch, sequence] shapes (any device): rows padded and masked, spare rows filled; the same numbers
    as each text alone. Each bucket of more than one row was verified at load against its rows run alone."""
    texts = ragged_texts(14, 150)
    alone = Alone(st_folder, 512)
    buckets = [(4, 16), (4, 64), (2, 256), (1, 512)]
    with Embedder(st_folder, "VAIML", "CPU", buckets=buckets) as embedder:
        assert embedder.buckets == [(1, 16), (4, 16), (1, 64), (4, 64), (1, 256), (2, 256), (1, 512)]
        assert [c.shape for c in embedder.bucket_checks] == [(4, 16), (4, 64), (2, 256)]
        assert all(c.ok and c.cosine > 0.99999 for c in embedder.bucket_checks)
        got = embedder.encode(texts)
        assert_close(got, np.stack([alone.pooled(t) for t in texts]))
        ran = embedder.last_batches
        assert all(b.bucket and b.shape in embedder.buckets for b in ran)
        lengths = [len(i) for i in embedder.tokenize(texts)]
        assert all(max(lengths[i] for i in b.rows) <= b.shape[1] for b in ran)
        assert any(len(b.rows) < b.shape[0] for b in ran) or any(b.shape[0] > 1 for b in ran)
    with pytest.raises(ValueError, match=r"below the model's maximum length 512: add a bucket \(1, 512\)"):
        Embedder(st_folder, "VAIML", "CPU", buckets=[(4, 64)])


def test_a_device_that_compiles_static_shapes_gets_buckets(st_folder):
    with Embedder(st_folder, "ONNXRUNTIME", "CPU", options={"static_shapes": True}, max_length=64) as embedder:
        assert embedder.runner.device_info.shape_mode == "static"
        assert embedder.buckets == [(1, 16), (8, 16), (1, 32), (8, 32), (1, 64), (8, 64)]
        texts = ragged_texts(6, 30)
        with Embedder(st_folder, "ONNXRUNTIME", "CPU", max_length=64) as ragged:
            assert_close(embedder.encode(texts), ragged.encode(texts), 1e-6)
            assert not ragged.buckets
        assert all(b.bucket for b in embedder.last_batches)


# ------------------------------------------------------------------------------------------ ids and bad input
def test_token_ids_in(st_folder):
    texts = ragged_texts(6, 80)
    with Embedder(st_folder, "ONNXRUNTIME", "CPU") as embedder:
        ids = embedder.tokenize(texts)
        np.testing.assert_array_equal(embedder.encode_ids(ids), embedder.encode(texts))
        assert embedder.vocab_size == 1000
        with pytest.raises(ValueError, match=r"ids\[1\]: token id 1000 is outside the vocabulary \(0 .. 999\)"):
            embedder.encode_ids([[2, 3], [2, 1000, 3]])
        with pytest.raises(ValueError, match=r"ids\[0\]: token id -1"):
            embedder.encode_ids([[-1]])
        with pytest.raises(ValueError, match=r"ids\[0\]: empty"):
            embedder.encode_ids([[]])
        with pytest.raises(ValueError, match=r"ids\[0\]: 600 tokens, past the model's maximum of 512"):
            embedder.encode_ids([[5] * 600])
        cut = embedder.encode_ids([[5] * 600], truncate=True)
        np.testing.assert_array_equal(cut, embedder.encode_ids([[5] * 512]))
        with pytest.raises(ValueError, match="integer token ids"):
            embedder.encode_ids([[1.5, 2.0]])


def test_bad_arguments_are_clear_errors(st_folder):
    with Embedder(st_folder, "ONNXRUNTIME", "CPU") as embedder:
        for call, error, text in [
            (lambda: embedder.encode([1, 2]), TypeError, r"texts\[0\]: a str, got int"),
            (lambda: embedder.encode(b"x"), TypeError, "a str or a sequence of str"),
            (lambda: embedder.encode(["a"], precision="int4"), ValueError, "precision 'int4'"),
            (lambda: embedder.encode(["a"], truncate_dim=0), ValueError, "truncate_dim"),
            (lambda: embedder.encode(["a"], truncate_dim=33), ValueError, "past the embedding's 32 dims"),
            (lambda: embedder.encode(["a"], batch_tokens=0), ValueError, "batch_tokens"),
        ]:
            with pytest.raises(error, match=text):
                call()
    with pytest.raises(ValueError, match="past the model's max_position_embeddings"):
        Embedder(st_folder, "ONNXRUNTIME", "CPU", max_length=1024)
    with pytest.raises(ValueError, match="on_wrong_bucket"):
        Embedder(st_folder, "ONNXRUNTIME", "CPU", buckets=[(2, 512)], on_wrong_bucket="ignore")


def test_threads_share_one_embedder(st_folder):
    texts = ragged_texts(16, 100)
    with Embedder(st_folder, "VAIML", "CPU", batch_tokens=256) as embedder:
        want = embedder.encode(texts)
        results: dict[int, np.ndarray] = {}

        def work(k: int) -> None:
            results[k] = embedder.encode(texts[k:] + texts[:k])

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for k, got in results.items():
        np.testing.assert_allclose(got, np.roll(want, -k, axis=0), atol=1e-6)
