"""The decoders in the forms people download (issue 43 part 8): npurt.models.genai_builder (ONNX Runtime GenAI's
model-builder layout) and npurt.models.decoder_forms.

Each form holds the weights of the standard form (npurt.models.decoders, same shape and seed): its logits equal the
standard form's and the numpy forward pass of tests/helpers within float32 rounding (measured: under 6e-6 on the
small presets, 1.2e-5 on bench), and its greedy tokens equal plain ONNX Runtime's loop over the same export, the
standard form's, and onnxruntime-genai's over the folder (its shared past/present buffer), up to the first
near-tie.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npurt.models import decoder_forms, genai_builder
from tests.helpers.decoders import (
    EOS_TOKEN_ID,
    MODEL_FILE,
    SHAPES,
    assert_tokens_agree,
    greedy_genai,
    greedy_onnxruntime,
    numpy_logits,
    require_genai,
)

PROMPT = [1, 23, 5, 77, 150, 11]  # below every vocabulary; on each builder shape 64 tokens, no eos, top-2 gaps >= 0.02
NEW_TOKENS = 64
BUILDER_SHAPES = ("gqa", "v300", "kv3", "h64")  # head_dim 16..64, 1..3 KV heads, 1..3 layers, vocab 300..4000
LOGIT_ATOL, LOGIT_RTOL = 1e-5, 2e-6  # builder vs standard vs numpy, float32 (measured max 1.05e-5 at a logit of 9.2)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("decoder_forms")


def form_folder(root, name: str, form: str, **options):
    """The preset ``name`` in ``form`` under root (built once per module)."""
    suffix = "".join(f"-{k}={v}" for k, v in sorted(options.items()))
    folder = root / f"{name}-{form}{suffix}"
    if not (folder / MODEL_FILE).is_file():
        decoder_forms.build_decoder_form(folder, name, form=form, **options)
    return folder


@pytest.fixture(scope="module")
def standard_run(root):
    """Plain ONNX Runtime's greedy run over the standard form, per preset (seed 0), computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = greedy_onnxruntime(form_folder(root, name, "standard") / MODEL_FILE, PROMPT, NEW_TOKENS,
                                             eos_token_id=EOS_TOKEN_ID, threads=1)
        return cache[name]
    return get


def session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def step(sess: ort.InferenceSession, shape, ids, total: int, past: dict | None) -> dict:
    """One run: ids [1, S], a mask of ``total`` ones, position_ids where the model takes them, the past (a previous
    run's presents, or empty)."""
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, total), np.int64)}
    if "position_ids" in {i.name for i in sess.get_inputs()}:
        feeds["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None]
    for i in range(shape.layers):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = (
                past[f"present.{i}.{kv}"] if past else np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32))
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


# ----------------------------------------------------------------------------------------------- the builder layout
def test_builder_layout(root):
    shape = SHAPES["gqa"]
    model = onnx.load(str(form_folder(root, "gqa", "builder") / MODEL_FILE))
    assert model.ir_version == 10
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 21), ("com.microsoft", 1)}

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    inputs = {v.name: dims(v) for v in model.graph.input}
    outputs = {v.name: dims(v) for v in model.graph.output}
    assert "position_ids" not in inputs and len(inputs) == 2 + 2 * shape.layers
    assert inputs["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert inputs["past_key_values.1.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert outputs["present.1.value"] == ["batch_size", 2, "total_sequence_length", 16]
    assert outputs["logits"] == ["batch_size", "sequence_length", 512]
    nodes = model.graph.node
    ops = [(n.domain or "", n.op_type) for n in nodes]
    assert ops.count(("", "SimplifiedLayerNormalization")) == 1  # the first norm, ONNX domain as the builder writes
    assert ops.count(("com.microsoft", "SkipSimplifiedLayerNormalization")) == 2 * shape.layers  # the rest
    assert ops.count(("com.microsoft", "GroupQueryAttention")) == shape.layers
    assert not {"Concat", "Softmax", "Pow"} & {op for _, op in ops}
    producers = {out: n for n in nodes for out in n.output}
    for i in range(shape.layers):
        gqa = producers[f"present.{i}.key"]
        assert gqa is producers[f"present.{i}.value"] and gqa.op_type == "GroupQueryAttention"
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
        assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
        assert (attrs["num_heads"], attrs["kv_num_heads"]) == (4, 2)
        assert attrs["scale"] == pytest.approx(0.25)
        assert list(gqa.input[3:9]) == [f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                                        genai_builder.SEQLENS_K, genai_builder.TOTAL_SEQ_LEN, "cos_cache",
                                        "sin_cache"]
    # the mask subgraph: seqlens_k = Cast(ReduceSum(mask, [1]) - 1), total = Cast(Gather(Shape(mask), 1))
    seqlens = producers[genai_builder.SEQLENS_K]
    sub = producers[seqlens.input[0]]
    reduce_sum = producers[sub.input[0]]
    assert (seqlens.op_type, sub.op_type, reduce_sum.op_type) == ("Cast", "Sub", "ReduceSum")
    assert reduce_sum.input[0] == "attention_mask"
    total = producers[genai_builder.TOTAL_SEQ_LEN]
    assert producers[producers[total.input[0]].input[0]].op_type == "Shape"
    caches = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_cache")}
    assert caches["cos_cache"].shape == caches["sin_cache"].shape == (shape.context_length, shape.head_dim // 2)
    config = json.loads((form_folder(root, "gqa", "builder") / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    assert "position_ids" not in config["model"]["decoder"]["inputs"]

    packed = onnx.load(str(form_folder(root, "gqa", "builder-packed") / MODEL_FILE))
    gqas = [n for n in packed.graph.node if n.op_type == "GroupQueryAttention"]
    assert all(n.input[0].endswith("qkv_proj/MatMul/output_0") and n.input[1] == n.input[2] == "" for n in gqas)


# ----------------------------------------------------------------------------------------------------- the logits
@pytest.mark.parametrize("name", BUILDER_SHAPES)
@pytest.mark.parametrize("form", decoder_forms.BUILDER_FORMS)
def test_builder_logits_equal_standard_and_numpy(root, name, form):
    """At prefill (the numpy forward pass too) and at two decode steps after it (the past fed back)."""
    shape = SHAPES[name]
    builder = session(form_folder(root, name, form) / MODEL_FILE)
    standard = session(form_folder(root, name, "standard") / MODEL_FILE)
    b = step(builder, shape, PROMPT, len(PROMPT), None)
    s = step(standard, shape, PROMPT, len(PROMPT), None)
    np.testing.assert_allclose(b["logits"][0], s["logits"][0], atol=LOGIT_ATOL, rtol=LOGIT_RTOL)
    np.testing.assert_allclose(b["logits"][0], numpy_logits(shape, 0, PROMPT), atol=LOGIT_ATOL, rtol=LOGIT_RTOL)
    for k, token in enumerate((5, 123)):
        total = len(PROMPT) + k + 1
        b = step(builder, shape, [token], total, b)
        s = step(standard, shape, [token], total, s)
        np.testing.assert_allclose(b["logits"], s["logits"], atol=LOGIT_ATOL, rtol=LOGIT_RTOL, err_msg=f"step {k}")
        np.testing.assert_allclose(b["present.0.key"], s["present.0.key"], atol=LOGIT_ATOL, rtol=LOGIT_RTOL)


# ------------------------------------------------------------------------------------------------- greedy tokens
@pytest.mark.parametrize("name", BUILDER_SHAPES)
def test_builder_greedy_tokens(root, standard_run, name):
    """onnxruntime-genai over the folder (past and present one shared buffer) == plain ONNX Runtime's loop over the
    same export (the past grown) == the standard form's tokens, packed and not."""
    require_genai()
    ref = standard_run(name)
    assert len(ref.tokens) == NEW_TOKENS and min(ref.gaps) > 1e-3, "the prompt should make 64 tokens, no near-tie"
    for form in decoder_forms.BUILDER_FORMS:
        folder = form_folder(root, name, form)
        loop = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, NEW_TOKENS, eos_token_id=EOS_TOKEN_ID, threads=1)
        assert_tokens_agree(loop.tokens, ref, f"ONNX Runtime's loop over the {form} form of {name}")
        genai = greedy_genai(folder, PROMPT, NEW_TOKENS)
        assert_tokens_agree(genai, loop, f"onnxruntime-genai over the {form} form of {name}")


def test_builder_genai_eos_and_external_data(root, standard_run):
    """The builder's genai_config eos ends onnxruntime-genai's run; the weights as external data under both
    exporters' names load the same."""
    require_genai()
    ref = standard_run("gqa")
    k = next(i for i in range(8, NEW_TOKENS) if ref.tokens[i] not in ref.tokens[:i])
    folder = form_folder(root, "gqa", "builder", eos_token_id=ref.tokens[k])
    assert greedy_genai(folder, PROMPT, NEW_TOKENS) == ref.tokens[:k]
    for form in ("builder", "standard"):
        for data in ("model.onnx.data", "model.onnx_data"):
            ext = form_folder(root, "gqa", form, external_data=data)
            assert (ext / data).stat().st_size > SHAPES["gqa"].parameters * 4 * 0.99
            assert (ext / MODEL_FILE).stat().st_size < 100_000
            assert greedy_genai(ext, PROMPT, 8) == ref.tokens[:8], (form, data)
            assert greedy_onnxruntime(ext / MODEL_FILE, PROMPT, 8, threads=1).tokens == ref.tokens[:8], (form, data)


# ------------------------------------------------------------------------------------------------ builds, CLI, errors
def test_builder_builds_are_deterministic(tmp_path):
    a = genai_builder.build_builder_decoder(tmp_path / "a", "gqa", seed=3).read_bytes()
    assert genai_builder.build_builder_decoder(tmp_path / "b", "gqa", seed=3).read_bytes() == a
    assert genai_builder.build_builder_decoder(tmp_path / "c", "gqa", seed=4).read_bytes() != a


def test_forms_cli(tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "npurt.models.decoder_forms", str(out), "--shape", "kv3",
                           "--form", "builder-packed", "--external-data", "model.onnx_data"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "builder-packed form" in done.stdout and (out / "model.onnx_data").is_file()
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["num_key_value_heads"] == 3
    assert decoder_forms.default_form("bench-builder") == "builder" and decoder_forms.default_form("gqa") == "standard"
    bench = SHAPES["bench-builder"]
    assert (bench.hidden, bench.layers, bench.vocab) == (512, 4, 8000)


def test_form_errors(tmp_path):
    with pytest.raises(ValueError, match="forms: standard, builder"):
        decoder_forms.build_decoder_form(tmp_path, "gqa", form="gguf")
    with pytest.raises(ValueError, match="presets"):
        decoder_forms.build_decoder_form(tmp_path, "nope", form="builder")
