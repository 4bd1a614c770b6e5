"""The decoders of npurt.models.decoders and the references npurt's generation is checked against (issue 36).

Each test shape: the graph's logits equal a numpy forward pass written from the weights; 64 greedy tokens after a
short prompt are the same from onnxruntime-genai, from plain ONNX Runtime's loop and from OpenVINO at f32 (compared
up to the first step whose reference top-2 logit gap is under 1e-3, where a near-tie may pick either token: none of
the presets at seed 0 has one, so all 64 are compared); the padding mask, the in-graph positions, external data,
the genai_config's eos, the stateful OpenVINO IR and deterministic builds.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from npurt.models import decoders
from tests.helpers.decoders import (
    EOS_TOKEN_ID,
    MODEL_FILE,
    NEW_TOKENS,
    PROMPT,
    SHAPES,
    TEST_SHAPES,
    DecoderShape,
    agreeing_prefix,
    assert_tokens_agree,
    build_decoder,
    decoder_folder,
    greedy_genai,
    greedy_onnxruntime,
    greedy_openvino,
    numpy_logits,
    require_genai,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("decoders")


@pytest.fixture(scope="module")
def reference(root):
    """The plain ONNX Runtime loop's greedy run per test shape (seed 0), computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = greedy_onnxruntime(decoder_folder(root, name) / MODEL_FILE, PROMPT, NEW_TOKENS,
                                             eos_token_id=EOS_TOKEN_ID, threads=1)
        return cache[name]
    return get


def session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def feeds_for(shape: DecoderShape, ids, mask, positions, past=None) -> dict:
    feeds = {"input_ids": np.asarray(ids, np.int64), "attention_mask": np.asarray(mask, np.int64)}
    if shape.has_position_ids:
        feeds["position_ids"] = np.asarray(positions, np.int64)
    batch = feeds["input_ids"].shape[0]
    for i in range(shape.layers):
        for kv in ("key", "value"):
            name = f"past_key_values.{i}.{kv}"
            feeds[name] = (past[f"present.{i}.{kv}"] if past is not None else
                           np.zeros((batch, shape.kv_heads, 0, shape.head_dim), np.float32))
    return feeds


def run(sess: ort.InferenceSession, feeds: dict) -> dict:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


# ------------------------------------------------------------------------------------------------ the graph itself
def test_layout_is_the_model_builders(root):
    shape = SHAPES["gqa"]
    model = onnx.load(str(decoder_folder(root, "gqa") / MODEL_FILE))
    assert model.ir_version == 9 and model.opset_import[0].version == 17 and len(model.opset_import) == 1
    assert {n.domain for n in model.graph.node} == {""}, "standard ONNX ops only"

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    inputs = {v.name: dims(v) for v in model.graph.input}
    outputs = {v.name: dims(v) for v in model.graph.output}
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert inputs["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert inputs["position_ids"] == ["batch_size", "sequence_length"]
    assert inputs["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert outputs["logits"] == ["batch_size", "sequence_length", 512]
    assert outputs["present.1.key"] == ["batch_size", 2, "total_sequence_length", 16]
    assert len(inputs) == 3 + 2 * shape.layers and len(outputs) == 1 + 2 * shape.layers
    producers = {out: n for n in model.graph.node for out in n.output}
    for i in range(shape.layers):
        for kv in ("key", "value"):
            node = producers[f"present.{i}.{kv}"]
            assert node.op_type == "Concat" and node.input[0] == f"past_key_values.{i}.{kv}"
    assert sum(n.op_type == "Gather" and n.output[0].endswith("_repeat") for n in model.graph.node) == 2 * shape.layers
    nopos = onnx.load(str(decoder_folder(root, "nopos") / MODEL_FILE))
    assert "position_ids" not in {v.name for v in nopos.graph.input}
    assert sum(n.op_type == "Expand" for n in nopos.graph.node) == 2 * SHAPES["nopos"].layers  # HF's repeat_kv


@pytest.mark.parametrize("name", TEST_SHAPES)
def test_logits_equal_numpy_llama(root, name):
    shape = SHAPES[name]
    out = run(session(decoder_folder(root, name) / MODEL_FILE),
              feeds_for(shape, [PROMPT], np.ones((1, len(PROMPT))), [np.arange(len(PROMPT))]))
    np.testing.assert_allclose(out["logits"][0], numpy_logits(name, 0, PROMPT), atol=1e-4, rtol=0)


def test_padding_mask_and_positions(root):
    """A left-padded row gives the logits of the same tokens alone, at prefill and at a decode step after it (the
    mask hides padded keys, the KV Concat keeps rows in place); with and without position_ids inputs."""
    for name in ("gqa", "nopos"):
        shape = SHAPES[name]
        sess = session(decoder_folder(root, name) / MODEL_FILE)
        short = PROMPT[2:]
        batch = run(sess, feeds_for(shape, [PROMPT, [0, 0, *short]], [[1] * 6, [0, 0, 1, 1, 1, 1]],
                                    [range(6), [1, 1, 0, 1, 2, 3]]))
        alone = run(sess, feeds_for(shape, [short], [[1] * 4], [range(4)]))
        np.testing.assert_allclose(batch["logits"][1, 2:], alone["logits"][0], atol=1e-5, rtol=0)
        nxt = [[5], [9]]
        batch2 = run(sess, feeds_for(shape, nxt, [[1] * 7, [0, 0, 1, 1, 1, 1, 1]], [[6], [4]], past=batch))
        alone2 = run(sess, feeds_for(shape, [[9]], [[1] * 5], [[4]], past=alone))
        np.testing.assert_allclose(batch2["logits"][1], alone2["logits"][0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(batch2["present.0.key"][1, :, 2:], alone2["present.0.key"][0], atol=1e-6)


def test_in_graph_positions_equal_given_ones(root):
    """nopos derives cumsum(attention_mask) - 1 in the graph: the same weights with position_ids given agree."""
    nopos = SHAPES["nopos"]
    given = dataclasses.replace(nopos, has_position_ids=True)
    a = session(decoder_folder(root, "nopos") / MODEL_FILE)
    b = session(decoder_folder(root, given) / MODEL_FILE)
    fa = run(a, feeds_for(nopos, [PROMPT], [[1] * 6], None))
    fb = run(b, feeds_for(given, [PROMPT], [[1] * 6], [range(6)]))
    np.testing.assert_allclose(fa["logits"], fb["logits"], atol=1e-6, rtol=0)
    sa = run(a, feeds_for(nopos, [[3]], [[1] * 7], None, past=fa))
    sb = run(b, feeds_for(given, [[3]], [[1] * 7], [[6]], past=fb))
    np.testing.assert_allclose(sa["logits"], sb["logits"], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------- the three engines
@pytest.mark.parametrize("name", TEST_SHAPES)
def test_openvino_tokens_and_logits_agree(root, reference, name):
    """OpenVINO f32's greedy tokens == plain ONNX Runtime's, 64 of them, the logits within 1e-4 at every step."""
    folder = decoder_folder(root, name)
    ref = reference(name)
    assert len(ref.tokens) == NEW_TOKENS and EOS_TOKEN_ID not in ref.tokens, "the preset should make 64 tokens"
    assert agreeing_prefix(ref) == NEW_TOKENS, "the presets at seed 0 have no near-tie"
    ov = greedy_openvino(folder / MODEL_FILE, PROMPT, NEW_TOKENS, eos_token_id=EOS_TOKEN_ID, threads=1)
    assert_tokens_agree(ov.tokens, ref, f"OpenVINO f32 on {name}")
    for step in range(NEW_TOKENS):
        np.testing.assert_allclose(ov.logits[step], ref.logits[step], atol=1e-4, rtol=0,
                                   err_msg=f"OpenVINO f32 logits at step {step}")


@pytest.mark.parametrize("name", TEST_SHAPES)
def test_genai_tokens_agree(root, reference, name):
    """onnxruntime-genai's greedy tokens == plain ONNX Runtime's (== OpenVINO f32's, above), 64 of them."""
    require_genai()
    ref = reference(name)
    got = greedy_genai(decoder_folder(root, name), PROMPT, NEW_TOKENS)
    assert assert_tokens_agree(got, ref, f"onnxruntime-genai on {name}") == NEW_TOKENS


def test_agreeing_prefix_stops_at_a_near_tie(reference):
    ref = reference("gqa")
    tied = type(ref)(ref.tokens, ref.logits, [*ref.gaps[:5], 5e-4, *ref.gaps[6:]])
    assert agreeing_prefix(tied) == 5 and agreeing_prefix(ref) == NEW_TOKENS
    assert assert_tokens_agree([*ref.tokens[:5], 0, 1], tied, "a run that differs after the tie") == 5
    with pytest.raises(AssertionError, match="tokens differ"):
        assert_tokens_agree([*ref.tokens[:4], ref.tokens[4] + 1], tied, "a run that differs before it")


def test_genai_config_eos_stops_generation(root, reference):
    """onnxruntime-genai reads the genai_config.json written: its eos_token_id ends generation there."""
    require_genai()
    ref = reference("gqa")
    k = next(i for i in range(8, NEW_TOKENS) if ref.tokens[i] not in ref.tokens[:i])
    eos = ref.tokens[k]
    folder = decoder_folder(root, "gqa", eos_token_id=eos)
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["eos_token_id"] == eos and config["model"]["context_length"] == 256
    assert greedy_genai(folder, PROMPT, NEW_TOKENS) == ref.tokens[:k]  # it stops at eos and drops it
    stopped = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, NEW_TOKENS, eos_token_id=eos, threads=1)
    assert stopped.tokens == ref.tokens[:k + 1]  # the reference loop keeps it


def test_external_data(root, reference):
    """external_data=True keeps the weights in model.onnx.data; both engines load it and give identical logits."""
    folder = decoder_folder(root, "mha", external_data=True)
    assert (folder / "model.onnx.data").stat().st_size >= SHAPES["mha"].parameters * 4 * 0.99
    assert (folder / MODEL_FILE).stat().st_size < 100_000
    model = onnx.load(str(folder / MODEL_FILE), load_external_data=False)
    big = [t for t in model.graph.initializer if t.name.endswith(("proj.weight", "embed_tokens.weight"))]
    assert len(big) == 7 * 3 + 1 and all(t.data_location == onnx.TensorProto.EXTERNAL for t in big)
    ext = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, 8, threads=1)
    ref = reference("mha")
    assert ext.tokens == ref.tokens[:8]
    for a, b in zip(ext.logits, ref.logits):
        np.testing.assert_array_equal(a, b)
    ov = greedy_openvino(folder / MODEL_FILE, PROMPT, 8, threads=1)
    assert ov.tokens == ref.tokens[:8]


def test_genai_runs_external_data(root, reference):
    require_genai()
    assert greedy_genai(decoder_folder(root, "mha", external_data=True), PROMPT, 8) == reference("mha").tokens[:8]


def test_openvino_stateful_ir(root, reference, tmp_path):
    """The IR for OpenVINO GenAI's LLMPipeline: its inputs, the KV cache as state read and written by one request,
    beam_idx gathering the past; stepping it greedily makes the reference's tokens."""
    ov = pytest.importorskip("openvino")  # a package dependency
    path = decoders.build_openvino_stateful(tmp_path, "gqa")
    assert json.loads((tmp_path / "config.json").read_text())["num_key_value_heads"] == 2
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == EOS_TOKEN_ID
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                         "INFERENCE_NUM_THREADS": 1})
    assert sorted(p.any_name for p in compiled.inputs) == ["attention_mask", "beam_idx", "input_ids", "position_ids"]
    assert [p.any_name for p in compiled.outputs] == ["logits"]
    request = compiled.create_infer_request()
    assert len(request.query_state()) == 2 * SHAPES["gqa"].layers
    ids, tokens, total = list(PROMPT), [], len(PROMPT)
    for _ in range(16):
        out = request.infer({"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64),
                             "position_ids": np.arange(total - len(ids), total, dtype=np.int64)[None],
                             "beam_idx": np.zeros(1, np.int32)})
        tokens.append(int(np.argmax(out["logits"][0, -1])))
        ids, total = [tokens[-1]], total + 1
    assert tokens == reference("gqa").tokens[:16]


# ------------------------------------------------------------------------------------------------ builds, CLI, errors
def test_builds_are_deterministic(tmp_path):
    a = build_decoder(tmp_path / "a", "gqa", seed=3).read_bytes()
    assert build_decoder(tmp_path / "b", "gqa", seed=3).read_bytes() == a
    assert build_decoder(tmp_path / "c", "gqa", seed=4).read_bytes() != a
    assert (tmp_path / "a" / "genai_config.json").read_bytes() == (tmp_path / "b" / "genai_config.json").read_bytes()
    # with external data, built again into the same folder: the same two files (onnx's save appends to a data file
    # that is there: the weights were written twice and the offsets moved)
    model = build_decoder(tmp_path / "d", "gqa", external_data=True)
    files = (model.read_bytes(), (model.parent / "model.onnx.data").read_bytes())
    build_decoder(tmp_path / "d", "gqa", external_data=True)
    assert (model.read_bytes(), (model.parent / "model.onnx.data").read_bytes()) == files


def test_cli(tmp_path, capsys):
    assert decoders.main([str(tmp_path / "out"), "--shape", "mha", "--seed", "2", "--external-data"]) == 0
    assert "1.8 MB" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.onnx.data").is_file()
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]
    assert (config["type"], config["vocab_size"], config["decoder"]["num_hidden_layers"]) == ("llama", 640, 3)
    with pytest.raises(SystemExit):
        decoders.main([str(tmp_path / "x"), "--shape", "nope"])


def test_bad_shapes():
    assert 70e6 < SHAPES["bench"].parameters * 4 < 80e6  # the benchmark's "about 75 MB"
    with pytest.raises(ValueError, match="presets: gqa"):
        decoders.shape_of("huge")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        DecoderShape(layers=1, hidden=8, heads=3, kv_heads=2, head_dim=4, intermediate=8, vocab=16, context_length=8)
    with pytest.raises(ValueError, match="even"):
        DecoderShape(layers=1, hidden=8, heads=2, kv_heads=2, head_dim=3, intermediate=8, vocab=16, context_length=8)
    with pytest.raises(ValueError, match="kv_repeat"):
        DecoderShape(layers=1, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=8, vocab=16, context_length=8,
                     kv_repeat="tile")
    with pytest.raises(ValueError, match="layers must be positive"):
        DecoderShape(layers=0, hidden=8, heads=2, kv_heads=2, head_dim=4, intermediate=8, vocab=16, context_length=8)
