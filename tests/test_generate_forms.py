"""Option ``decoder`` on the other forms people download (issue 43 parts 4 and 5): int4 (MatMulNBits) and fp16 exports
on the ONNX Runtime backends, optimum's folders (config.json + generation_config.json, the merged decoder), the one
folder resolver, and the configs it refuses."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from npurt import Generator, NpuUnsupportedError, RunnerFactory
from npurt.generate import folder as model_folder
from npurt.models import decoder_forms, optimum_forms
from npurt.models.decoder_precision import Int4
from tests.helpers.decoders import assert_tokens_agree, greedy_genai, greedy_onnxruntime, require_genai

PROMPT = [1, 23, 5, 77, 150, 11]
DECODER = {"max_length": 96, "prefill_chunk": 4}
FP16_LOGITS = 0.05  # npurt's fp16 form against the fp16 export, same engine (measured below 2e-3)


def make(root, name, **options):
    folder = root / name
    if not folder.exists():
        decoder_forms.build_decoder_form(folder, options.pop("shape", "gqa"), **options)
    return folder


@pytest.mark.parametrize("backend", ["VAIML", "ONNXRUNTIME"])
@pytest.mark.parametrize(("form", "int4"), [("builder", Int4(32, True, 0)), ("builder", Int4(128, False, 0)),
                                            ("standard", Int4(32, False, 0)), ("builder", Int4(32, True, 4))])
def test_int4_exports_give_onnxruntime_genai_s_tokens(tmp_path, backend, form, int4):
    """MatMulNBits exports (ONNX Runtime's own quantizer: blocks 32 and 128, with and without zero points, accuracy
    levels 0 and 4): npurt's 32 greedy tokens equal onnxruntime-genai's on the same folder, the cache and its derived
    form in the export's own dtype."""
    require_genai()
    folder = make(tmp_path, "int4", form=form, precision="int4", int4=int4)
    want = greedy_genai(folder, PROMPT, 32)
    with RunnerFactory.create_runner(backend, folder, {"device": "CPU", "decoder": DECODER}) as r:
        assert "MatMulNBits" in r.decoder.contrib_ops
        assert Generator(r).generate(PROMPT, 32) == want


@pytest.mark.parametrize("form", ["builder", "standard"])
def test_fp16_exports_keep_their_dtype(tmp_path, form):
    """An fp16 export (past, present and logits float16): the cache is float16, and the logits each id is picked from
    are the export's own (plain ONNX Runtime's loop over it) within FP16_LOGITS, tokens equal before a near-tie."""
    folder = make(tmp_path, "fp16", form=form, precision="fp16")
    reference = greedy_onnxruntime(model_folder.resolve(folder).model, PROMPT, 16)
    with RunnerFactory.create_runner("VAIML", folder, {"device": "CPU", "decoder": DECODER}) as r:
        state = r.get_stream_state(r.open_stream())
        assert {a.dtype for a in state.values()} == {np.dtype(np.float16)}
        g = Generator(r)
        tokens = []
        for step, token in enumerate(g.stream(PROMPT, 16)):
            np.testing.assert_allclose(g.last_logits, reference.logits[step], atol=FP16_LOGITS, rtol=0)
            tokens.append(token)
        assert_tokens_agree(tokens, reference, "npurt fp16", tolerance=2 * FP16_LOGITS)


@pytest.mark.parametrize("backend", ["VAIML", "OPENVINO"])
def test_optimum_s_merged_decoder(tmp_path, backend):
    """optimum's folder (decoder_model_merged.onnx, config.json, generation_config.json, no genai_config.json): the
    folder resolves to the merged file, the If is resolved to its with-past branch, and the tokens are the export's
    (OpenVINO runs the merged graph's with-past branch wrongly; resolved, it runs the plain one)."""
    folder = make(tmp_path, "merged", form="optimum-merged")
    found = model_folder.resolve(folder)
    assert found.model.name == "decoder_model_merged.onnx" and found.context_length == 256
    assert found.eos_token_ids == (2,) and found.bos_token_id == 1
    want = greedy_onnxruntime(found.model, PROMPT, 32).tokens
    options = {"inference_precision": "f32"} if backend == "OPENVINO" else {}
    with RunnerFactory.create_runner(backend, folder, {"device": "CPU", "decoder": DECODER, **options}) as r:
        assert Generator(r).generate(PROMPT, 32) == want


def test_a_merged_decoder_without_its_with_past_branch_is_refused(tmp_path):
    folder = make(tmp_path, "merged", form="optimum-merged")
    model = onnx.load(str(folder / "decoder_model_merged.onnx"))
    branch = next(n for n in model.graph.node if n.op_type == "If")
    then_branch = next(a for a in branch.attribute if a.name == "then_branch")
    else_branch = next(a for a in branch.attribute if a.name == "else_branch")
    then_branch.g.CopyFrom(else_branch.g)  # both without a past
    onnx.save(model, str(folder / "decoder_model_merged.onnx"))
    with pytest.raises(NpuUnsupportedError, match="without its with-past branch"):
        RunnerFactory.create_runner("VAIML", folder, {"device": "CPU", "decoder": DECODER})


def test_the_folder_resolver(tmp_path):
    """One resolver for the runner, the text layer and the server: a folder or its file; genai_config.json's model
    file; eos as a list (Llama 3, Qwen); an eos that is not an id is refused naming the file (it became no eos);
    the context length from max_position_embeddings; a folder with several ONNX files and no config names them."""
    folder = make(tmp_path, "optimum", form="optimum")
    assert model_folder.resolve(folder / "model.onnx").folder == folder
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [2, 7]}))
    with RunnerFactory.create_runner("VAIML", folder, {"device": "CPU", "decoder": DECODER}) as r:
        assert r.decoder.eos_token_ids == (2, 7) and r.decoder.context_length == 256
        g = Generator(r)
        free = g.generate(PROMPT, 40)
        stop = next(t for t in free if t not in (2, 7))
        (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [stop, 2]}))
    with RunnerFactory.create_runner("VAIML", folder, {"device": "CPU", "decoder": DECODER}) as r:
        tokens = Generator(r).generate(PROMPT, 40, eos_token_id=r.decoder.eos_token_ids)
        assert tokens == free[:free.index(stop) + 1]
    for bad in ("2", 2.5, [2, "x"], True):
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": bad}))
        with pytest.raises(ValueError, match="generation_config.json: eos_token_id must be a token id"):
            RunnerFactory.create_runner("VAIML", folder, {"device": "CPU", "decoder": DECODER})
    (folder / "generation_config.json").unlink()
    (folder / "extra.onnx").write_bytes((folder / "model.onnx").read_bytes())
    (folder / "model.onnx").rename(folder / "other.onnx")
    with pytest.raises(ValueError, match="no decoder model to take .* ONNX files: extra.onnx, other.onnx"):
        RunnerFactory.create_runner("VAIML", folder, {"device": "CPU", "decoder": DECODER})
    assert optimum_forms  # (the module that writes optimum's folders)


def test_a_runner_made_directly_with_option_decoder_is_told_where(tmp_path):
    """Decoder preparation lives in the factory: Runner(backend, model, {"decoder": ...}) says so."""
    from npurt.factory import backend_class
    from npurt.runner import Runner

    folder = make(tmp_path, "gqa")
    with pytest.raises(ValueError, match="prepared by RunnerFactory.create_runner"):
        Runner(backend_class("VAIML"), folder / "model.onnx", {"device": "CPU", "decoder": DECODER})
