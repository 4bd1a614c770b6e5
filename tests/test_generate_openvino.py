"""Option ``decoder`` on OPENVINO over the exports people download (issue 43 part 3): ONNX Runtime GenAI's builder
form (com.microsoft GroupQueryAttention, fused rotary, Simplified / SkipSimplified LayerNormalization), int4
(``MatMulNBits`` by ONNX Runtime's own quantizer) and fp16, against plain ONNX Runtime's greedy loop over the same
export; and what OpenVINO cannot convert, refused naming the operator.

Tolerances (max |logit difference| at every step the tokens share, OpenVINO at f32 against ONNX Runtime's CPU
provider; measured on this machine over 64 tokens):

- fp32 builder form (presets v300, kv3, h64, l4v8k, h512, and packed Q/K/V); int4 at accuracy level 0 with
  ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` 0 (the CPU plugin otherwise quantizes activations to int8 per group):
  measured <= 1.4e-5, held to 1e-4.
- int4 at accuracy level 4 (ONNX Runtime quantizes activations to int8 per block) with
  ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` = the block size (OpenVINO quantizes them too; a rounding that falls otherwise
  moves the logits), on l4v8k: measured 0.16 / 0.21 (blocks 32 / 128, symmetric), 0.24 / 0.31 (with zero points);
  0.16-0.35 with OpenVINO's quantization off: held to 0.5.
- fp16 (weights, cache and logits; the builder form on l4v8k, the standard one on gqa): measured 0.0156 and 0.0078,
  one fp16 step at those logits (ONNX Runtime computes in fp16, OpenVINO in f32 and rounds the logits to fp16):
  held to 3e-2 (FP16 below).

Tokens are equal before the reference's first step whose top-2 gap is under twice the tolerance (1e-3 where the
tolerance is smaller): within it, either engine may pick either token.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import openvino as ov
import pytest

from npurt import Generator, NpuTensor, NpuUnsupportedError, RunnerFactory, StatusCode, TensorDirection, TensorType
from npurt.factory import AutoLoadError, backend_class, create_auto
from npurt.generate import openvino_convert, openvino_form
from npurt.models.decoder_forms import build_decoder_form, build_form_model
from npurt.models.decoder_precision import Int4
from npurt.models.decoders import shape_of
from npurt.models.genai_builder import builder_genai_config, save_model
from tests.helpers.decoders import NEAR_TIE, NEW_TOKENS, agreeing_prefix, greedy_onnxruntime

DECODER = {"max_length": 96, "prefill_chunk": 4}
EXACT = 1e-4
FP16 = 3e-2
BUILDER_SHAPES = ("v300", "kv3", "h64", "l4v8k", "h512")  # issue 43's ranges, each head_dim a multiple of 16
INT4_SHAPE = "l4v8k"
PROMPT = [1, 17, 42, 99, 7, 250]  # ids below every shape's vocabulary (v300's is 300)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


def openvino_runner(path, **options):
    return RunnerFactory.create_runner("OPENVINO", path, {"device": "CPU", "inference_precision": "f32",
                                                          "decoder": DECODER, **options})


def generate_against(path, tolerance, **options):
    """npurt on OPENVINO against plain ONNX Runtime's loop over ``path``: the tokens agree before a near-tie (a
    top-2 gap under twice ``tolerance``), and the logits are within ``tolerance`` at every step they share; returns
    (steps compared, max difference, the runner's decoder facts)."""
    reference = greedy_onnxruntime(path, PROMPT, NEW_TOKENS)
    with openvino_runner(path, **options) as runner:
        facts = runner.decoder
        assert [i.name for i in runner.get_tensors_info(TensorDirection.INPUT)] == ["input_ids", "position"]
        g = Generator(runner)
        tokens, worst = [], 0.0
        for k, token in enumerate(g.stream(PROMPT, NEW_TOKENS)):
            worst = max(worst, float(np.abs(np.asarray(g.last_logits, np.float32) - reference.logits[k]).max()))
            tokens.append(token)
            if token != reference.tokens[k]:
                break
        assert g.stats["copies"] == 0
    n = agreeing_prefix(reference, max(NEAR_TIE, 2 * tolerance))
    assert tokens[:n] == reference.tokens[:n], f"tokens differ within the first {n}: {tokens} / {reference.tokens}"
    assert worst <= tolerance, f"logits {worst:.3g} from ONNX Runtime's (tolerance {tolerance})"
    return n, worst, facts


@pytest.mark.parametrize("shape", BUILDER_SHAPES)
def test_the_builder_form_fp32(root, shape):
    """GroupQueryAttention's growing form: 64 tokens and every step's logits equal ONNX Runtime's."""
    path = build_decoder_form(root / f"builder-{shape}", shape, form="builder")
    n, worst, facts = generate_against(path, EXACT)
    assert facts.cache == openvino_form.GROWING and not facts.pinned
    assert "GroupQueryAttention" in facts.contrib_ops


def test_the_builder_form_with_packed_qkv(root):
    path = build_decoder_form(root / "builder-packed", "kv3", form="builder-packed")
    generate_against(path, EXACT)


def test_the_builder_form_fp16(root):
    path = build_decoder_form(root / "builder-fp16", INT4_SHAPE, form="builder", precision="fp16")
    _, worst, _ = generate_against(path, FP16)
    assert worst > 0  # (fp16 against f32: never bit-equal)


# block size x zero points x accuracy level: every pair of their settings once (an orthogonal array of 4 rows; the
# full grid's 8 conversions cost the suite ~25 s; all eight passed when last run, 2026-12-07)
@pytest.mark.parametrize(("block_size", "zero_points", "accuracy_level"),
                         [(32, False, 0), (32, True, 4), (128, False, 4), (128, True, 0)])
def test_int4_builder_form(root, block_size, zero_points, accuracy_level):
    """MatMulNBits from ONNX Runtime's quantizer: accuracy level 0 exact with the CPU plugin's dynamic quantization
    off; level 4 with OpenVINO quantizing activations per block as ONNX Runtime does, within 0.5."""
    int4 = Int4(block_size, not zero_points, accuracy_level)
    path = build_decoder_form(root / int4.label, INT4_SHAPE, form="builder", precision="int4", int4=int4)
    group = 0 if accuracy_level == 0 else block_size
    tolerance = EXACT if accuracy_level == 0 else 0.5
    generate_against(path, tolerance, engine_options={"DYNAMIC_QUANTIZATION_GROUP_SIZE": group})


def test_int4_standard_form(root):
    """MatMulNBits in a standard-attention export (the Concat form): npurt's static form made stateful."""
    path = build_decoder_form(root / "standard-int4", "gqa", precision="int4")
    n, _, facts = generate_against(path, EXACT, engine_options={"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    assert facts.cache == openvino_form.STATIC and facts.contrib_ops == ("MatMulNBits",) and n == NEW_TOKENS


def test_fp16_standard_form(root):
    """An fp16 export in standard operators (onnxruntime.transformers' converter, fp16 inputs and outputs): the
    static form's cache in fp16, as the export's."""
    path = build_decoder_form(root / "standard-fp16", "gqa", precision="fp16")
    _, _, facts = generate_against(path, FP16)
    assert facts.cache == openvino_form.STATIC


@pytest.mark.parametrize("data_name", ["model.onnx.data", "model.onnx_data"])
def test_external_data_under_both_exporters_names(root, data_name):
    """The builder form's weights as external data, under onnx's (and optimum's) name and ONNX Runtime GenAI's
    builder's: OpenVINO's reader resolves them beside the model."""
    path = build_decoder_form(root / f"external-{data_name}", INT4_SHAPE, form="builder", precision="int4",
                              external_data=data_name)
    assert (path.parent / data_name).stat().st_size > 100_000
    generate_against(path, EXACT, engine_options={"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})


def test_a_new_prompt_and_a_rewind_cut_the_growing_state(root):
    """A run of the growing form appends to the rows the state holds: one Generator runs prompts one after another
    (each from position 0: the state reset), continues a sequence from an earlier row (``start=``, ``rewind`` then
    ``append``: the state cut to those rows) with the tokens and logits each sequence gives alone."""
    path = build_decoder_form(root / "builder-reuse", "kv3", form="builder")
    first, second = (greedy_onnxruntime(path, prompt, 12).tokens for prompt in (PROMPT, [5, 6, 7]))
    resumed = greedy_onnxruntime(path, PROMPT[:4] + [5, 6, 7], 8)
    with openvino_runner(path) as runner:
        g = Generator(runner)
        assert g.generate(PROMPT, 12) == first
        assert g.generate([5, 6, 7], 12) == second
        assert g.generate(PROMPT, 12) == first
        assert g.generate([5, 6, 7], 8, start=4) == resumed.tokens  # 17 rows held, cut to 4
        g.rewind(7)  # 14 rows held, cut to 7
        np.testing.assert_allclose(g.append([resumed.tokens[0]]), resumed.logits[1], atol=EXACT, rtol=0)
        assert g.tokens == (*PROMPT[:4], 5, 6, 7, resumed.tokens[0])


def test_the_growing_form_s_attention_runs_fused_with_its_cache(root):
    """The growing form is the pattern OpenVINO's CPU plug-in fuses with the cache in place (openvino_convert): in
    the runner's compiled model as OpenVINO runs it, each layer's attention is one node reading the layer's two
    variables and writing them, none decomposed, and the cache at f32 (not the plug-in's default u8)."""
    path = build_decoder_form(root / "builder-fused", "kv3", form="builder")
    with openvino_runner(path) as runner:
        compiled = runner._core.variants.default.engine.compiled_model  # noqa: SLF001 - what OpenVINO runs
        ops = compiled.get_runtime_model().get_ordered_ops()
        kind = {op.get_friendly_name(): op.get_rt_info()["layerType"].astype(str) for op in ops}
        fused = [op for op in ops if kind[op.get_friendly_name()] == "ScaledDotProductAttention"]
        assert len(fused) == runner.decoder.layers and "Softmax" not in kind.values()
        for op in fused:
            reads = [kind[i.get_source_output().get_node().get_friendly_name()] for i in op.inputs()]
            writes = [kind[t.get_node().get_friendly_name()] for out in op.outputs() for t in out.get_target_inputs()]
            assert reads.count("MemoryInput") == 2 and writes.count("MemoryOutput") == 2
        assert compiled.get_property("KV_CACHE_PRECISION") == ov.Type.f32


def test_a_run_that_does_not_start_where_the_state_ends_fails(root):
    """Runner.execute on a stream directly: a run of the growing form from any position but the rows the stream's
    state holds (earlier, at 0 with one id, whose mask would broadcast over every key; later) fails naming the
    check, with the state as it was; a state cut by hand (set_state, as Generator cuts it) runs on from there with
    the export's logits."""
    path = build_decoder_form(root / "builder-direct", "kv3", form="builder")
    reference = greedy_onnxruntime(path, PROMPT, 2)
    cut = greedy_onnxruntime(path, PROMPT[:3] + [5, 6], 1)
    with openvino_runner(path) as runner:
        stream = runner.open_stream()
        logits = runner.allocate_npu_tensor(runner.get_tensor_info_by_name("logits", TensorType.CPU)
                                            .replace(shape=(1, 1, runner.decoder.vocab_size)))

        def run(ids, position):
            tensors = [NpuTensor(runner.get_tensor_info_by_name(name, TensorType.CPU).replace(shape=a.shape), a)
                       for name, a in (("input_ids", np.array([ids], np.int64)),
                                       ("position", np.array([position], np.int64)))]
            return runner.execute([tensors], [[logits]], stream=stream), logits.numpy()[0, 0].copy()

        status, row = run(PROMPT, 0)
        assert status is StatusCode.SUCCESS, runner.last_error
        np.testing.assert_allclose(row, reference.logits[0], atol=EXACT, rtol=0)
        held = stream.state()
        for position in (0, 2, len(PROMPT) - 1, len(PROMPT) + 1):
            status, _ = run([reference.tokens[0]], position)
            assert status is StatusCode.RUNTIME_ERROR and openvino_convert.POSITION_CHECK in runner.last_error, position
        assert all(np.array_equal(a, held[name]) for name, a in stream.state().items())
        status, row = run([reference.tokens[0]], len(PROMPT))
        assert status is StatusCode.SUCCESS, runner.last_error
        np.testing.assert_allclose(row, reference.logits[1], atol=EXACT, rtol=0)
        assert stream.set_state({name: a[:, :, :3] for name, a in stream.state().items()}) is StatusCode.SUCCESS
        status, row = run([5, 6], 3)
        assert status is StatusCode.SUCCESS, runner.last_error
        np.testing.assert_allclose(row, cut.logits[0], atol=EXACT, rtol=0)


def test_two_generators_interleaved_each_with_its_own_growing_state(root):
    """Two Generators over one runner, their steps interleaved: each stream's infer request has its own variables."""
    path = build_decoder_form(root / "builder-two", "kv3", form="builder")
    first, second = (greedy_onnxruntime(path, prompt, 16).tokens for prompt in (PROMPT, [5, 6, 7]))
    with openvino_runner(path) as runner:
        a, b = Generator(runner), Generator(runner)
        pairs = list(zip(a.stream(PROMPT, 16), b.stream([5, 6, 7], 16)))
    assert [x for x, _ in pairs] == first and [y for _, y in pairs] == second


def test_the_cache_dir_keeps_the_growing_form_alone(root, tmp_path):
    """With cache_dir the growing form's IR is kept (nothing else but the facts read from the export's graph and the
    verdict of its check against the export: the export is converted directly), and a second runner opens it without
    converting or checking again."""
    path = build_decoder_form(root / "builder-cache", "kv3", form="builder")
    want = greedy_onnxruntime(path, PROMPT, 8).tokens
    with openvino_runner(path, cache_dir=str(tmp_path)) as runner:
        assert Generator(runner).generate(PROMPT, 8) == want
    files = sorted(p.name for p in (tmp_path / "decoders").glob("*/*"))
    assert files[:3] == ["decoder_growing.bin", "decoder_growing.xml", "export.json"] and len(files) == 4
    assert files[3].startswith("verified-openvino-c")
    ir = next((tmp_path / "decoders").glob("*/decoder_growing.xml"))
    verdict = next((tmp_path / "decoders").glob("*/verified-*.json"))
    made = ir.stat().st_mtime_ns, verdict.stat().st_mtime_ns
    with openvino_runner(path, cache_dir=str(tmp_path)) as runner:
        assert Generator(runner).generate(PROMPT, 8) == want
    assert (ir.stat().st_mtime_ns, verdict.stat().st_mtime_ns) == made


def test_what_openvino_cannot_convert_is_refused_naming_it(root):
    """An operator the frontend has no conversion for: NpuUnsupportedError naming it (not a list of names:
    OpenVINO decides), and AUTO moves on to the next backend."""
    model = build_form_model("gqa")
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.op_type, node.domain = "FancyUnknownOp", "com.microsoft"
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    path = save_model(model, root / "unknown.onnx")
    with pytest.raises(NpuUnsupportedError, match=r"No conversion rule found for operations: com\.microsoft\.Fancy"):
        openvino_runner(path)
    classes = {name: backend_class(name) for name in ("OPENVINO", "VAIML")}  # (the real ones: the suite registers toys)
    with pytest.raises(AutoLoadError) as raised:
        create_auto(path, {"device": "CPU", "decoder": DECODER}, classes)
    failures = dict(raised.value.failures)
    assert "FancyUnknownOp" in failures["OPENVINO"] and "VAIML" in failures  # AUTO went on to the next


def test_a_group_query_attention_the_growing_form_does_not_take(root):
    """Settings the growing form does not compute (interleaved rotary here) are refused naming them."""
    model = build_form_model("kv3", form="builder")
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            next(a for a in node.attribute if a.name == "rotary_interleaved").i = 1
    folder = root / "interleaved"
    folder.mkdir()
    path = save_model(model, folder / "model.onnx")
    (folder / "genai_config.json").write_text(json.dumps(builder_genai_config(shape_of("kv3"))))
    with pytest.raises(NpuUnsupportedError, match="GroupQueryAttention.*rotary_interleaved"):
        openvino_runner(path)


def test_the_npu_stays_refused_with_its_reason(root):
    path = build_decoder_form(root / "builder-npu", "kv3", form="builder")
    with pytest.raises(NpuUnsupportedError, match="NPUW"):
        RunnerFactory.create_runner("OPENVINO", path, {"device": "NPU", "decoder": DECODER})


def test_a_refusal_names_only_the_operators_that_fail_themselves(root, tmp_path):
    """An operator the frontend cannot convert makes it fail the converted operators it feeds too (the builder's int4
    embedding, a GatherBlockQuantized, named the two normalizations after it): the refusal names the first only."""
    import subprocess
    import sys

    model = build_form_model("kv3", form="builder")
    embedding = next(n for n in model.graph.node if n.op_type == "Gather")
    embedding.op_type, embedding.domain = "FancyUnknownOp", "com.microsoft"
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    path = save_model(model, tmp_path / "model.onnx")
    done = subprocess.run([sys.executable, str(Path(openvino_form.__file__).with_name("openvino_convert.py")),
                           str(path), str(tmp_path / "out.xml"), "{}", "growing", "[1, 64]"],
                          capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    reasons = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("FancyUnknownOp" in r for r in reasons), reasons
    assert not any("Normalization" in r for r in reasons), reasons
