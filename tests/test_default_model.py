"""The embedded default model (a handwritten digit classifier trained by npurt.models.make_default) and its held-out
samples: what the file is, that both engines run it as numpy's forward pass does, directly and through npurt, that
it recognises the samples, and that retraining rebuilds it."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
import pytest
from onnx import numpy_helper

from npurt import RunnerFactory
from npurt.models import (
    DEFAULT_MODEL_DESCRIPTION,
    DEFAULT_SAMPLES,
    ascii_art,
    default_model_path,
    default_samples,
    make_default,
)
from tests.helpers.engines import ov_cpu_properties

# the accuracy make_default aims for; the committed model gets 97.5 % of its 360 held-out images and all samples
MIN_ACCURACY = 0.95
NUMPY_TOLERANCE = 1e-5
needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                   reason="scikit-learn (the dev extra) is not installed: it holds the training data")


@functools.cache
def committed_weights() -> make_default.Weights:
    tensors = {t.name: numpy_helper.to_array(t) for t in onnx.load(default_model_path()).graph.initializer}
    return make_default.Weights(tensors["conv.weight"], tensors["conv.bias"], tensors["fc.weight"], tensors["fc.bias"])


def numpy_scores(images: np.ndarray) -> np.ndarray:
    """The committed float32 weights in numpy's float64 forward pass: the reference both engines must meet."""
    w = committed_weights()
    assert all(a.dtype == np.float32 for a in w.arrays())
    return make_default.forward(w.astype(np.float64), images.astype(np.float64))[0]


def ort_scores(path, images: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"image": images})[0]


def test_model_file_is_small_and_declares_a_dynamic_batch_of_8x8_images():
    path = default_model_path()
    assert path.stat().st_size < 32_000 and DEFAULT_SAMPLES.stat().st_size < 8_000
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 9 and [(o.domain, o.version) for o in model.opset_import] == [("", 17)]

    def dims(value_info):
        return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]

    (image,), (scores,) = model.graph.input, model.graph.output
    assert image.name == "image" and image.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert scores.name == "scores" and scores.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert dims(image) == ["N", 1, 8, 8] and dims(scores) == ["N", 10]
    assert "digit" in DEFAULT_MODEL_DESCRIPTION and "1x8x8" in DEFAULT_MODEL_DESCRIPTION


def test_samples_are_balanced_model_inputs():
    images, labels = default_samples()
    assert images.dtype == np.float32 and images.ndim == 4 and images.shape[1:] == (1, 8, 8)
    assert labels.dtype == np.int64 and labels.shape == (len(images),) and 20 <= len(images) <= 100
    assert images.min() == 0.0 and images.max() == 1.0
    # the data set's 17 grey levels, scaled
    np.testing.assert_array_equal(images * 16, np.rint(images * 16))
    assert labels[:10].tolist() == list(range(10))
    assert np.bincount(labels, minlength=10).tolist() == [len(labels) // 10] * 10


def test_raw_engines_agree_with_numpy_and_recognise_the_samples():
    images, labels = default_samples()
    reference = numpy_scores(images)
    np.testing.assert_allclose(reference.sum(axis=1), 1.0, atol=1e-12)
    core = ov.Core()
    # f32: this CPU's plugin otherwise computes in bf16 (NOTES.md)
    compiled = core.compile_model(str(default_model_path()), "CPU", ov_cpu_properties())
    for batch in (slice(None), slice(0, 1), slice(7, 10)):  # the batch dim is dynamic in both engines
        want = reference[batch]
        np.testing.assert_allclose(ort_scores(default_model_path(), images[batch]), want, atol=NUMPY_TOLERANCE, rtol=0)
        np.testing.assert_allclose(compiled(images[batch])[0], want, atol=NUMPY_TOLERANCE, rtol=0)
    accuracy = np.mean(reference.argmax(axis=1) == labels)
    assert accuracy >= MIN_ACCURACY, f"{accuracy:.2%} of {len(labels)}"


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
@pytest.mark.parametrize("views", ["CPU", "HW"])
def test_npurt_runs_the_samples_on_cpu(backend, views):
    if backend not in RunnerFactory.available_backends():
        pytest.skip(f"{backend} is not registered: {RunnerFactory.backend_errors().get(backend)}")
    images, labels = default_samples()
    options = {"device": "CPU", "shapes": {"image": list(images.shape)}}
    if views == "CPU":  # the model's own float32 ports: exactly the engine's results
        options |= {"input_tensor_type": "CPU", "output_tensor_type": "CPU"}
    with RunnerFactory.create_runner(backend, default_model_path(), options) as runner:
        scores = runner.run({"image": images})["scores"]
    assert scores.shape == (len(images), 10) and scores.dtype == np.float32
    reference = numpy_scores(images)
    # HW views travel as FP16 (OpenVINO) or BF16 (VAIML): compare at that precision
    np.testing.assert_allclose(scores, reference, atol=NUMPY_TOLERANCE if views == "CPU" else 2e-2, rtol=0)
    np.testing.assert_array_equal(scores.argmax(axis=1), reference.argmax(axis=1))
    assert np.mean(scores.argmax(axis=1) == labels) >= MIN_ACCURACY


def test_ascii_art_draws_ink_dark_to_bright_two_characters_per_pixel():
    images, _ = default_samples()
    art = ascii_art(images[0]).splitlines()
    assert len(art) == 8 and all(len(line) <= 16 for line in art)
    ramp = np.zeros((2, 3))
    ramp[0] = [0.0, 4 / 9, 1.0]
    assert ascii_art(ramp).split("\n") == ["  ==@@", ""]  # zero ink is blank; rows lose trailing blanks
    two = ascii_art(images[0], images[1], gap=3).splitlines()
    assert len(two) == 8
    assert all(line[:16].rstrip() == one for line, one in zip(two, ascii_art(images[0], gap=0).splitlines()))
    with pytest.raises(ValueError, match="shape"):
        ascii_art(images[:2])


@needs_sklearn
def test_retraining_rebuilds_the_committed_predictions(tmp_path):
    assert make_default.main([str(tmp_path)]) == 0
    # no arithmetic goes into the samples: same bytes everywhere
    assert (tmp_path / "default_samples.npz").read_bytes() == DEFAULT_SAMPLES.read_bytes()
    images, labels = default_samples()
    again = ort_scores(tmp_path / "default.onnx", images)
    committed = ort_scores(default_model_path(), images)
    # float64 training on another CPU may round differently in the last bits; here the bytes match
    np.testing.assert_array_equal(again.argmax(axis=1), committed.argmax(axis=1))
    np.testing.assert_allclose(again, committed, atol=1e-4, rtol=0)


@needs_sklearn
def test_held_out_accuracy_is_what_the_script_claims():
    digits, labels = make_default.load_digits()
    assert digits.shape == (1797, 8, 8) and digits.max() == 16
    train, held_out, samples = make_default.split(labels, np.random.RandomState(make_default.SEED))
    assert not set(train) & set(held_out) and set(samples) <= set(held_out)
    assert len(train) + len(held_out) == len(labels)
    scores = ort_scores(default_model_path(), make_default.to_input(digits[held_out]))
    accuracy = np.mean(scores.argmax(axis=1) == labels[held_out])
    assert accuracy >= MIN_ACCURACY, f"{accuracy:.2%} of {len(held_out)}"
