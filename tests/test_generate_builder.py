"""Option ``decoder`` on ONNX Runtime GenAI's model-builder form (issue 43 parts 1 and 2): GroupQueryAttention in
its own shared-buffer mode gives onnxruntime-genai's tokens on the ONNX Runtime backends (shapes open and pinned,
separate and packed QKV, four shapes), and every derived form is checked against its export before use: a form that
does not give the export's logits, rotary tables shorter than max_length and attention forms npurt does not derive
are refused before anything runs, never wrong tokens."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from npurt import Generator, NpuError, NpuUnsupportedError, RunnerFactory
from npurt.generate import layout
from tests.helpers.decoders import (
    MODEL_FILE,
    assert_tokens_agree,
    form_folder,
    greedy_genai,
    greedy_onnxruntime,
    require_genai,
)

PROMPT = [1, 23, 5, 77, 150, 11]
NEW_TOKENS = 64
SHAPES = ("gqa", "v300", "kv3", "h64")  # head_dim 16..64, 1..3 KV heads, 1..3 layers, vocab 300..4000
DECODER = {"max_length": 96, "prefill_chunk": 4}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("builder")


def runner(backend: str, folder, **options):
    device = "NPU" if backend == "QNN" else "CPU"
    return RunnerFactory.create_runner(backend, folder / MODEL_FILE,
                                       {"device": device, "decoder": DECODER, **options})


@pytest.mark.parametrize("backend", ["VAIML", "ONNXRUNTIME"])
@pytest.mark.parametrize("shape", SHAPES)
def test_tokens_equal_onnxruntime_genai(root, shape, backend):
    """64 greedy tokens equal onnxruntime-genai's on the same folder (its own shared past/present buffer); the cache
    stays in place (no host copy), the derived form says it is GroupQueryAttention's and how it was checked."""
    require_genai()
    folder = form_folder(root, shape, "builder")
    want = greedy_genai(folder, PROMPT, NEW_TOKENS)
    reference = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, NEW_TOKENS)
    assert reference.tokens == want  # the two anchors agree (no near-tie on these prompts)
    with runner(backend, folder) as r:
        assert r.decoder.attention == layout.GROUP_QUERY
        assert r.decoder.verification.startswith("by its parts on onnxruntime")  # (verify_parts: no second model)
        g = Generator(r)
        tokens = g.generate(PROMPT, NEW_TOKENS)
        assert_tokens_agree(tokens, reference, f"npurt {backend} builder {shape}")
        assert tokens == want
        assert g.stats["copies"] == 0 and r.stats["copies"] == 0


@pytest.mark.parametrize("form", ["builder", "builder-packed"])
@pytest.mark.parametrize("chunk", [1, 4, 8])
def test_pinned_shapes_and_packed_qkv(root, form, chunk):
    """Shapes pinned as on an NPU (prefill chunks of 1, 4 and 8 over a 6-id prompt: one id a run, an overlapping
    last chunk, a prompt shorter than a chunk), the QKV projections separate or packed into one input: the logits each
    id is picked from are the export's within 1e-4 at every step."""
    folder = form_folder(root, "gqa", form)
    reference = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, 16)
    with runner("VAIML", folder, static_shapes=True, decoder={"max_length": 48, "prefill_chunk": chunk}) as r:
        assert r.decoder.pinned
        g = Generator(r)
        for step, token in enumerate(g.stream(PROMPT, 16)):
            np.testing.assert_allclose(g.last_logits, reference.logits[step], atol=1e-4, rtol=0,
                                       err_msg=f"step {step}")
            assert token == reference.tokens[step]


def test_a_conversation_continues_in_the_shared_buffer(root):
    """start= on the builder form: GroupQueryAttention writes the second turn's rows after the first's, in place,
    and the tokens equal a fresh run over the whole sequence."""
    folder = form_folder(root, "kv3", "builder")
    path = folder / MODEL_FILE
    with runner("VAIML", folder) as r:
        g = Generator(r)
        first = g.generate(PROMPT, 8)
        second = g.generate([first[-1], 9, 10], 8, start=g.position)
        assert second == greedy_onnxruntime(path, PROMPT + first + [9, 10], 8).tokens


def test_the_htp_emulator_places_it_or_says_why(root):
    """On the HTP emulator at FP16 (pinned shapes): the tokens are the export's up to a near-tie at FP16's scale,
    and placement names the nodes the HTP did not take."""
    pytest.importorskip("onnxruntime_qnn")
    folder = form_folder(root, "gqa", "builder")
    reference = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, 8)
    with runner("QNN", folder) as r:
        tokens = Generator(r).generate(PROMPT, 8)
        assert_tokens_agree(tokens, reference, "npurt QNN builder", tolerance=0.2)
        off = {p.op_type for p in r.placement if "QNN" not in p.device}
        assert "GroupQueryAttention" in off  # (the QNN EP has no GroupQueryAttention)
        assert all(p.reason or "QNN" in p.device for p in r.placement), off
    with pytest.raises(NpuError, match=r"cannot run entirely on QNNExecutionProvider .*GroupQueryAttention"):
        runner("QNN", folder, fallback="error")


def test_rotary_tables_shorter_than_max_length_are_refused(root, tmp_path):
    """The builder writes cos/sin caches of the context length; a max_length past them would rotate positions the
    tables do not hold (ONNX Runtime: 'cos_cache dimension 0 shall not be less than total_sequence_length' at that
    step, mid-generation). Refused at load, naming the rows."""
    folder = form_folder(root, "gqa", "builder")
    copy = tmp_path / "long"
    copy.mkdir()
    (copy / MODEL_FILE).write_bytes((folder / MODEL_FILE).read_bytes())
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["context_length"] = 4096  # a config that claims more than the tables hold
    (copy / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(NpuUnsupportedError, match="rotary tables have 256 rows, fewer than max_length 300"):
        runner("VAIML", copy, decoder={"max_length": 300, "prefill_chunk": 4})


@pytest.mark.parametrize("op", ["MultiHeadAttention", "RotaryEmbedding"])
def test_attention_not_understood_is_refused_by_name(root, tmp_path, op):
    model = onnx.load(str(form_folder(root, "gqa", "builder") / MODEL_FILE))
    model.graph.node.append(onnx.helper.make_node(op, ["input_ids"], [f"{op}_out"], domain="com.microsoft"))
    (tmp_path / MODEL_FILE).write_bytes(model.SerializeToString())
    (tmp_path / "genai_config.json").write_text((form_folder(root, "gqa", "builder") / "genai_config.json").read_text())
    with pytest.raises(NpuUnsupportedError, match=f"attention by {op} is not one npurt derives"):
        runner("VAIML", tmp_path)


def test_the_head_size_the_builder_names_comes_from_its_config(root, tmp_path):
    """The builder (0.18) names the cache's head size dim (``kv_cache_dim``) and gives its value in genai_config.json
    (``head_size``): npurt reads it there (the folder loads and runs: test_tokens_equal_onnxruntime_genai). Without
    the config, the refusal names the dims it found and where the value could have come from; a config.json (an
    optimum-style folder) gives it too."""
    folder = form_folder(root, "gqa", "builder")
    model = onnx.load(str(folder / MODEL_FILE))
    past = next(i for i in model.graph.input if i.name == "past_key_values.0.key")
    assert [d.dim_param or d.dim_value for d in past.type.tensor_type.shape.dim][3] == "kv_cache_dim"
    (tmp_path / MODEL_FILE).write_bytes((folder / MODEL_FILE).read_bytes())
    with pytest.raises(NpuUnsupportedError, match=r"past input 'past_key_values.0.key' has dims \[batch_size, \d+, "
                                                  r"past_sequence_length, kv_cache_dim\]: its head_dim \(dim 3, "
                                                  r"'kv_cache_dim'\) is not fixed.*genai_config.json's"):
        runner("VAIML", tmp_path)
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    hf = {key: config["decoder"][key] for key in ("num_attention_heads", "hidden_size", "num_key_value_heads")}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with runner("VAIML", tmp_path) as r:
        assert r.decoder.head_dim == config["decoder"]["head_size"]


def test_a_form_that_is_not_the_export_is_refused(root, tmp_path, monkeypatch):
    """The check against the export catches what the layout reader missed: the Concat form's derivation for pinned
    shapes (the whole cache under a mask) applied to a GroupQueryAttention export (the wrong tokens of issue 43) is
    refused, naming the step and the difference; with cache_dir the verdict is kept, and the next load refuses
    without checking again."""
    monkeypatch.setattr(layout, "_attention", lambda *args: layout.CONCAT)
    cache = tmp_path / "cache"
    with pytest.raises(NpuUnsupportedError, match=r"does not give the export's logits \(first at the prompt in one "
                                                  r"run: step 1 \(position 7\); they differ by up to"):
        runner("VAIML", form_folder(root, "gqa", "builder"), cache_dir=str(cache), static_shapes=True)
    verdicts = list(cache.glob("decoders/*/verified-onnxruntime-c4.json"))
    assert len(verdicts) == 1 and json.loads(verdicts[0].read_text())["ok"] is False
    with pytest.raises(NpuUnsupportedError, match="does not give the export's logits"):
        runner("VAIML", form_folder(root, "gqa", "builder"), cache_dir=str(cache), static_shapes=True)


def test_a_form_whose_ports_are_wrong_is_refused_by_its_parts(root, monkeypatch):
    """The check by parts runs npurt's head on the engine: a static form whose mask hides the first row (the export's
    subgraph then gives GroupQueryAttention a seqlens_k one short: wrong tokens) is refused before anything runs,
    naming the port and the position."""
    from npurt.generate import static_form

    derive = static_form.derive

    def hiding_the_first_row(*args, **kwargs):
        form = derive(*args, **kwargs)
        graph = form.model.graph
        compare = next(n for n in graph.node if n.op_type == "GreaterOrEqual" and n.name.startswith("__npurt"))
        one = static_form.PREFIX + "_one"
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(1, np.int64), one))
        compare.input[1] = one
        return form
    monkeypatch.setattr(static_form, "derive", hiding_the_first_row)
    with pytest.raises(NpuUnsupportedError, match=r"does not give the export's logits \(first at npurt's ports at "
                                                  r"position 0 with 7 new: attention_mask \[\[0, 1, 1"):
        runner("VAIML", form_folder(root, "gqa", "builder"))


def test_a_cache_read_outside_the_attention_gets_the_full_check(root, tmp_path):
    """The parts prove a form whose cache only GroupQueryAttention reads; an export that reads a past elsewhere too
    (here a node that takes its shape, used by nothing) is checked by running both models instead, and still loads."""
    folder = form_folder(root, "gqa", "builder")
    model = onnx.load(str(folder / MODEL_FILE))
    model.graph.node.append(onnx.helper.make_node("Shape", ["past_key_values.0.key"], ["past_shape"]))
    (tmp_path / MODEL_FILE).write_bytes(model.SerializeToString())
    (tmp_path / "genai_config.json").write_text((folder / "genai_config.json").read_text())
    with runner("VAIML", tmp_path) as r:
        assert "a 7-id prompt in one run and in chunks" in r.decoder.verification
        assert Generator(r).generate(PROMPT, 8) == greedy_onnxruntime(folder / MODEL_FILE, PROMPT, 8).tokens
