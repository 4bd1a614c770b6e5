"""The VART-ML flow on a model with dynamic dims and pinned shapes (option ``shapes``), on every backend, over real
models: every output dim the graph decides from the pinned inputs is reported static, so ``allocate_npu_tensor``
on ``get_tensors_info`` works and ``execute`` runs, with the engine's own results."""

from __future__ import annotations

import gc
import os

import numpy as np
import onnxruntime as ort
import pytest

from npurt import NpuTensor, RunnerFactory, StatusCode, TensorDirection, TensorType
from tests.helpers.models import model_or_skip

# model, pinned input shapes (silero-vad: one 512-sample chunk of 16 kHz audio)
CASES = {
    "ocr_cls": {"x": [1, 3, 48, 192]},
    "ocr_rec": {"x": [1, 3, 48, 320]},
    "ocr_det": {"x": [1, 3, 320, 320]},
    "silero_vad": {"input": [1, 512], "state": [2, 1, 128], "sr": []},
}


def model_name(name: str, backend: str) -> str:
    # OpenVINO 2026.4 cannot read silero's op15 export; the same network exported for it
    return "silero_vad_op18_ifless" if name == "silero_vad" and backend == "OPENVINO" else name


def inputs_for(name: str, runner) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    feeds = {}
    for info in runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU):
        if info.numpy_dtype == np.int64:  # silero's sample rate
            feeds[info.name] = np.array(16000, np.int64).reshape(info.shape)
        elif info.name == "state":
            feeds[info.name] = np.zeros(info.shape, np.float32)
        else:
            feeds[info.name] = rng.random(info.shape, np.float32)
    return feeds


def raw_outputs(backend: str, path, pinned: dict[str, list[int]], feeds: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """The engine used directly on the model pinned as the runner pins it, with the runner's settings (one thread,
    f32): OpenVINO's compile_model on the reshaped model, ONNX Runtime's InferenceSession on the file."""
    if backend == "OPENVINO":
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        model.reshape({name: ov.PartialShape(shape) for name, shape in pinned.items()})
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
        result = compiled.create_infer_request().infer(feeds)
        return {out.get_any_name(): np.array(result[out]) for out in compiled.outputs}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
@pytest.mark.parametrize("name", list(CASES))
def test_pinned_shapes_give_static_outputs_and_the_vart_ml_flow_runs(name, backend):
    path = model_or_skip(model_name(name, backend))
    pinned = CASES[name]
    options = {"device": "CPU", "shapes": pinned, "num_threads": 1, "inference_precision": "f32"}
    with RunnerFactory.create_runner(backend, path, options) as r:
        outs_info = r.get_tensors_info(TensorDirection.OUTPUT)
        for info in outs_info:
            assert info.is_static, f"{backend} {name}: output {info.name} reported {list(info.shape)}"
        ins_info = r.get_tensors_info(TensorDirection.INPUT)
        assert [list(i.shape) for i in ins_info] == [pinned[i.name] for i in ins_info]
        feeds = inputs_for(name, r)
        ins = [r.allocate_npu_tensor(i) for i in ins_info]
        for t in ins:
            t.numpy()[...] = feeds[t.info.name]
        outs = [r.allocate_npu_tensor(i) for i in outs_info]
        assert r.execute([ins], [outs]) is StatusCode.SUCCESS, r.last_error
        assert r.stats["copies"] == 0
    # the engine's own results: the engine used directly on the pinned model, with the same settings, bit for bit
    expected = raw_outputs(backend, path, pinned, feeds)
    for t in outs:
        np.testing.assert_array_equal(t.numpy(), expected[t.info.name])


class CountingSession(ort.InferenceSession):
    made: list[str | bytes] = []

    def __init__(self, source, *args, **kwargs):
        CountingSession.made.append(source)
        super().__init__(source, *args, **kwargs)


@pytest.mark.parametrize("name", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_pinned_shapes_cost_one_session_over_the_model(name, monkeypatch):
    """create_runner with pinned shapes makes one session over the model (the one that runs), and run() needs no
    other; the static output dims come from a session over the graph without its weights, made on the first query
    of the outputs, once (at load it was a third of the classifier's load; a second session over an onnx.load'ed
    copy of the whole model was the start-up regression before that)."""
    path = model_or_skip(name)
    CountingSession.made = []
    monkeypatch.setattr(ort, "InferenceSession", CountingSession)
    from npurt.backends.onnxruntime import adapter, sessions

    cpu_session = sessions.cpu_session  # (the runner's sessions on the CPU provider: made without the constructor)

    def counted(source, so):
        if hasattr(ort.InferenceSession, "_from_initialized_c_session"):  # (else the constructor counts it)
            CountingSession.made.append(source)
        return cpu_session(source, so)
    monkeypatch.setattr(adapter, "cpu_session", counted)
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "shapes": CASES[name]}) as r:
        x = np.random.default_rng(0).random(CASES[name]["x"], np.float32)
        (y,) = r.run({"x": x}).values()
        assert CountingSession.made == [str(path)]  # the load and run(): the model's session alone
        for _ in range(2):
            outs = r.get_tensors_info(TensorDirection.OUTPUT)
            assert [list(i.shape) for i in outs] == [list(y.shape)]
    over_the_model = [s for s in CountingSession.made if isinstance(s, str)]
    weightless = [s for s in CountingSession.made if isinstance(s, bytes)]
    assert over_the_model == [str(path)]
    assert len(weightless) == 1 and len(weightless[0]) < path.stat().st_size / 5, [len(w) for w in weightless]


def test_execute_checks_outputs_against_pinned_dims_decided_on_first_use():
    """execute with the caller's tensors and no query before it: the outputs are checked against the dims the pinned
    inputs decide (read then, once): a tensor of those dims runs, another is INVALID_OUTPUT."""
    path = model_or_skip("ocr_rec")
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "shapes": CASES["ocr_rec"]}) as r:
        info_in = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0]
        x = NpuTensor(info_in, np.random.default_rng(1).random(info_in.shape, np.float32))
        (expected,) = r.run({"x": x.numpy()}).values()
        spec = r.output_specs[0]
        assert None in spec.shape  # the model leaves a dim open: only the pinned input decides it
        wrong = NpuTensor(r.get_port(spec.name).cpu.replace(shape=(1, 41, 6625)), np.empty((1, 41, 6625), np.float32))
        assert r.execute([[x]], [[wrong]]) is StatusCode.INVALID_OUTPUT
        assert "shape" in r.last_error, r.last_error
        y = np.empty(expected.shape, np.float32)
        assert r.execute([[x]], [[NpuTensor(r.get_port(spec.name).cpu, y)]]) is StatusCode.SUCCESS, r.last_error
        np.testing.assert_array_equal(y, expected)


def test_pinned_dims_are_read_from_the_model_loaded_after_its_file_is_gone(tmp_path):
    """The dims read on first use come from the model the runner loaded, even where its file was removed or replaced
    since (a model written to a temporary file)."""
    source = model_or_skip("ocr_cls")
    path = tmp_path / "model.onnx"
    path.write_bytes(source.read_bytes())
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "shapes": CASES["ocr_cls"]}) as r:
        path.unlink()
        path.write_bytes(b"not a model")
        assert [list(i.shape) for i in r.get_tensors_info(TensorDirection.OUTPUT)] == [[1, 2]]


def test_pinned_outputs_on_onnx_runtime_equal_the_engine_used_directly():
    """On ONNX Runtime's CPU provider the running session still loads the model file as it is: the pinned runner's
    results equal a plain InferenceSession's bit for bit."""
    path = model_or_skip("ocr_cls")
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "shapes": CASES["ocr_cls"],
                                                     "num_threads": 1}) as r:
        info_in = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0]
        info_out = r.get_tensors_info(TensorDirection.OUTPUT)[0]
        assert list(info_out.shape) == [1, 2]
        x = np.random.default_rng(3).random(info_in.shape, np.float32)
        y = r.allocate_npu_tensor(info_out)
        assert r.execute([[NpuTensor(info_in, x)]], [[y]]) is StatusCode.SUCCESS, r.last_error
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    raw = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(y.numpy(), raw.run(None, {"x": x})[0])


def test_pinned_output_shapes_are_kept_in_the_cache(tmp_path):
    """A load from npurt's cache_dir reports the same static outputs without reading them again."""
    path = model_or_skip("ocr_rec")
    options = {"device": "CPU", "shapes": CASES["ocr_rec"], "cache_dir": str(tmp_path)}
    with RunnerFactory.create_runner("VAIML", path, options) as r:
        first = r.get_tensors_info(TensorDirection.OUTPUT)
    with RunnerFactory.create_runner("VAIML", path, options) as r:
        assert any(step.startswith("loaded from the cache") for step, _ in r.device_info.load_steps)
        assert r.get_tensors_info(TensorDirection.OUTPUT) == first
        assert first[0].is_static


def _fds_on(path) -> list[str]:
    """This process's fds open on ``path``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            pass
    return found


def test_the_model_file_held_for_first_use_is_closed_by_close_or_collection(tmp_path):
    """The file a pinned runner holds open until its output dims are read goes at close(), and with a runner
    dropped unclosed: no fd is left on the model."""
    path = tmp_path / "model.onnx"
    path.write_bytes(model_or_skip("ocr_cls").read_bytes())
    options = {"device": "CPU", "shapes": CASES["ocr_cls"]}
    r = RunnerFactory.create_runner("VAIML", path, options)
    assert len(_fds_on(path)) == 1  # held: the dims are not read yet
    r.close()
    assert _fds_on(path) == []
    r = RunnerFactory.create_runner("VAIML", path, options)
    r.get_tensors_info(TensorDirection.OUTPUT)
    assert _fds_on(path) == []  # read: let go at once
    r.close()
    r = RunnerFactory.create_runner("VAIML", path, options)
    del r
    gc.collect()
    assert _fds_on(path) == []
