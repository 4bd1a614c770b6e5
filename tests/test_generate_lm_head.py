"""The derived form runs a row-wise LM head on its input's last row only (issue 57: a prompt's other rows of logits
were computed and thrown away, ~20 ms of SmolLM2-135M's first token), and the check by parts proves that form: the
slice takes the last row, and the head gives that row as it gives it among the others. A head it cannot prove
row-wise keeps the slice after the export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npurt import Generator, RunnerFactory, onnx_external
from npurt.generate import folder as folder_of
from npurt.generate import layout, static_form, verify_parts
from npurt.models.decoder_precision import Int4
from npurt.onnx_graph import read_skeleton
from tests.helpers.decoders import MODEL_FILE, PROMPT, form_folder, greedy_onnxruntime
from tests.helpers.missing import require_module

DECODER = {"max_length": 48, "prefill_chunk": 4}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("lm_head")


def _head(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if layout.LOGITS in n.output)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_the_lm_head_runs_on_the_last_row(root, tmp_path, precision):
    """fp32 (MatMul) and int4 (MatMulNBits, int8 activations): the derived form's LM head reads its input's last row
    and nothing else slices the logits; the check by parts says so; every step's logits are the export's within
    1e-4 and the tokens its own."""
    options = {}
    if precision == "int4":
        require_module("onnx_ir", "ONNX Runtime's int4 quantizer needs onnx_ir (extra 'test')")
        options = {"precision": "int4", "int4": Int4(32, False, 4)}
    folder = form_folder(root, "gqa", "builder", **options)
    reference = greedy_onnxruntime(folder / MODEL_FILE, PROMPT, 8)
    with RunnerFactory.create_runner("VAIML", folder / MODEL_FILE,
                                     {"device": "CPU", "decoder": DECODER, "cache_dir": tmp_path}) as r:
        assert "LM head run on the last row only" in r.decoder.verification, r.decoder.verification
        g = Generator(r)
        for step, token in enumerate(g.stream(PROMPT, 8)):
            np.testing.assert_allclose(g.last_logits, reference.logits[step], atol=1e-4, rtol=0,
                                       err_msg=f"step {step}")
            assert token == reference.tokens[step]
    derived = onnx.load(str(next(tmp_path.glob("decoders/*/decoder_static.onnx"))), load_external_data=False)
    head = _head(derived)
    assert head.op_type == ("MatMulNBits" if precision == "int4" else "MatMul")
    assert head.input[0].endswith(static_form.LAST_SUFFIX)
    assert not any(o.endswith(static_form.FULL_SUFFIX) for n in derived.graph.node for o in n.output)


def _export_and_form(root, tmp_path, edit=None):
    """The gqa builder export (``edit``ed, and saved where edited) and its derived form, over the export's weights as
    npurt writes it: the export, its skeleton, the form and its layout."""
    export = form_folder(root, "gqa", "builder") / MODEL_FILE
    cache_dims = folder_of.resolve(export.parent).cache_dims  # (its genai_config.json's head size, KV heads)
    if edit is not None:
        model = onnx.load(str(export))
        edit(model)
        export = tmp_path / "export.onnx"
        onnx.save(model, str(export))
    skeleton = read_skeleton(export)
    weight_dims = {w.name: w.dims for w in skeleton.weights.values()}
    model = skeleton.model
    shape = layout.read(model, DECODER["max_length"], weight_dims, cache_dims)
    form = static_form.derive(model, DECODER["max_length"], weight_dims=weight_dims, cache_dims=cache_dims)
    return export, skeleton, form.model, shape


def _written(form, skeleton, tmp_path):
    path = tmp_path / "derived.onnx"
    onnx_external.write(form, skeleton, path)
    return path


def test_a_slice_of_another_row_is_refused(root, tmp_path):
    """A form whose slice before the LM head takes the first row, not the last: the check by parts refuses it,
    naming the head's input."""
    export, skeleton, form, shape = _export_and_form(root, tmp_path)
    cut = next(n for n in form.graph.node if n.output[0].endswith(static_form.LAST_SUFFIX))
    starts, ends = cut.input[1], cut.input[2]
    for tensor in form.graph.initializer:
        if tensor.name in (starts, ends):
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.array([0 if tensor.name == starts else 1], np.int64),
                                                          tensor.name))
    verdict = verify_parts.check(export, _written(form, skeleton, tmp_path), shape, DECODER["prefill_chunk"], 1e-3)
    assert verdict is not None and not verdict["ok"], verdict
    assert "is not its last row" in str(verdict["where"])


def test_a_head_not_known_row_wise_keeps_the_slice_after(root, tmp_path):
    """Logits that come out of anything but a MatMul over a 2-D weight or a MatMulNBits (here an Identity after the
    head): the whole logits are computed and their last row sliced after the export, still proved by parts."""
    def identity_after_the_head(model):
        head = _head(model)
        head.output[0] = "head_out"
        model.graph.node.append(onnx.helper.make_node("Identity", ["head_out"], [layout.LOGITS]))

    export, skeleton, form, shape = _export_and_form(root, tmp_path, identity_after_the_head)
    assert static_form.row_wise_head(onnx.load(str(export)).graph) is None
    assert _head(form).op_type == "Slice" and _head(form).input[0] == layout.LOGITS + static_form.FULL_SUFFIX
    verdict = verify_parts.check(export, _written(form, skeleton, tmp_path), shape, DECODER["prefill_chunk"], 1e-3)
    assert verdict is not None and verdict["ok"] and "lm_head" not in verdict, verdict
