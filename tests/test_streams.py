"""Streams: many independent stateful sequences through one runner, on the real silero-vad models.

- carried pairs (option state_pairs {"state": "stateN"}) on both backends, against the model run with the state
  carried by hand through the engine used directly (ONNX Runtime: bit for bit; OpenVINO: f32 tolerance);
- OpenVINO's own stateful models (ReadValue / Assign, made here with OpenVINO's MakeStateful transformation), against
  the pair model carried by hand;
- reset, checkpoint and restore, interleaving, and what happens with bad handles, closes and resets in flight.
"""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import openvino as ov
import pytest

from npurt import NpuTensor, RunnerFactory, StatusCode, TensorType
from tests.helpers.engines import ov_cpu_properties
from tests.helpers.models import model_or_skip

PAIR = {"state": "stateN"}
SR = np.array(16000, np.int64)


def chunks(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((1, 576)) * 0.3).astype(np.float32) for _ in range(n)]


def vad_model(backend: str) -> str:
    # OpenVINO 2026.4 cannot read the op15 export (its ONNX frontend refuses it): the same network exported for it
    return "silero_vad_op18_ifless" if backend == "OPENVINO" else "silero_vad"


def by_hand(backend: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    """The engine used directly, the state copied from each output to the next input by the app."""
    path = str(model_or_skip(vad_model(backend)))
    state = np.zeros((2, 1, 128), np.float32)
    probs = []
    if backend == "VAIML":
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for x in xs:
            p, state = session.run(None, {"input": x, "state": state, "sr": SR})
            probs.append(p)
        return probs
    request = ov.Core().compile_model(path, "CPU", ov_cpu_properties()).create_infer_request()
    for x in xs:
        out = request.infer({"input": x, "state": state, "sr": SR})
        probs.append(out["output"].copy())
        state = out["stateN"].copy()
    return probs


def same(backend: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        if backend == "VAIML":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.fixture(params=["OPENVINO", "VAIML"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def vad(backend):
    with RunnerFactory.create_runner(backend, model_or_skip(vad_model(backend)),
                                     {"device": "CPU", "state_pairs": PAIR, "max_concurrent_runs": 4}) as r:
        yield r


def execute_chunk(r, stream, x: np.ndarray) -> np.ndarray:
    out = np.full((1, 1), np.nan, np.float32)
    ins = [NpuTensor(r.get_tensor_info_by_name("input", TensorType.CPU).replace(shape=x.shape), x),
           NpuTensor(r.get_tensor_info_by_name("sr", TensorType.CPU), SR)]
    status = r.execute([ins], [[NpuTensor(r.get_tensor_info_by_name("output", TensorType.CPU).replace(shape=(1, 1)),
                                          out)]], stream=stream)
    assert status is StatusCode.SUCCESS, r.last_error
    return out


def test_carried_state_matches_the_state_carried_by_hand(backend, vad):
    xs = chunks(6)
    want = by_hand(backend, xs)
    assert [i.name for i in vad.get_tensors_info(0, TensorType.CPU)] == ["input", "sr"]  # the app passes these only
    assert [o.name for o in vad.get_tensors_info(1, TensorType.CPU)] == ["output"]
    s = vad.open_stream()
    same(backend, [s.run({"input": x, "sr": SR})["output"] for x in xs], want)
    t = vad.open_stream()
    same(backend, [execute_chunk(vad, t, x) for x in xs], want)
    assert vad.stats["copies"] == 0  # the state never left the runner's tensors
    # no stream given: the default stream, with its own state
    same(backend, [vad.run({"input": x, "sr": SR})["output"] for x in xs], want)


def test_run_and_execute_take_turns_on_one_stream(backend, vad):
    """run() keeps the engine's state array as it is and execute() the runner's tensors: one stream switching
    between them carries the same state, with no host copy."""
    xs = chunks(8, seed=3)
    want = by_hand(backend, xs)
    s = vad.open_stream()
    got = []
    for k, x in enumerate(xs):
        got.append(s.run({"input": x, "sr": SR})["output"] if k % 3 != 1 else execute_chunk(vad, s, x))
    same(backend, got, want)
    assert vad.stats["copies"] == 0
    assert s.state()["state"].shape == (2, 1, 128)


def test_each_stream_has_its_own_engine_context_on_openvino():
    """On OpenVINO a stream runs on an infer request of its own (streams side by side do not queue for the pool's
    max_concurrent_runs requests); closing the stream gives it back."""
    with RunnerFactory.create_runner("OPENVINO", model_or_skip(vad_model("OPENVINO")),
                                     {"device": "CPU", "state_pairs": PAIR}) as r:
        streams = [r.open_stream() for _ in range(3)]
        for s in streams:
            s.run({"input": chunks(1)[0], "sr": SR})
        engine = r.engine_for()
        assert len(engine.contexts) == 3 and r.max_concurrent_runs < 3
        assert streams[0].close() is StatusCode.SUCCESS
        assert len(engine.contexts) == 2


def test_reset_checkpoint_and_restore(backend, vad):
    xs = chunks(6, seed=1)
    want = by_hand(backend, xs)
    s = vad.open_stream()
    for x in xs[:3]:
        s.run({"input": x, "sr": SR})
    checkpoint = s.state()
    assert set(checkpoint) == {"state"} and checkpoint["state"].shape == (2, 1, 128)
    same(backend, [s.run({"input": x, "sr": SR})["output"] for x in xs[3:]], want[3:])
    assert s.set_state(checkpoint) is StatusCode.SUCCESS  # back to after the third chunk
    same(backend, [s.run({"input": x, "sr": SR})["output"] for x in xs[3:]], want[3:])
    assert s.reset() is StatusCode.SUCCESS  # as a new stream
    same(backend, [s.run({"input": x, "sr": SR})["output"] for x in xs], want)
    assert s.set_state({"nope": checkpoint["state"]}) is StatusCode.INVALID_INPUT
    assert "not state this stream carries" in vad.last_error


def test_four_streams_interleaved_equal_four_streams_one_after_another(backend, vad):
    inputs = [chunks(5, seed=10 + k) for k in range(4)]
    want = [by_hand(backend, xs) for xs in inputs]
    streams = [vad.open_stream() for _ in range(4)]
    got: list[list[np.ndarray]] = [[] for _ in range(4)]
    for step in range(5):  # round robin, half of them asynchronous
        jobs = []
        for k, s in enumerate(streams):
            if k % 2:
                got[k].append(execute_chunk(vad, s, inputs[k][step]))
            else:
                out = np.full((1, 1), np.nan, np.float32)
                x = inputs[k][step]
                ins = [NpuTensor(vad.get_tensor_info_by_name("input", TensorType.CPU).replace(shape=x.shape), x),
                       NpuTensor(vad.get_tensor_info_by_name("sr", TensorType.CPU), SR)]
                outs = [NpuTensor(vad.get_tensor_info_by_name("output", TensorType.CPU).replace(shape=(1, 1)), out)]
                job = vad.execute_async([ins], [outs], stream=s)
                assert job.status is StatusCode.SUCCESS, vad.last_error
                jobs.append((k, job, out, ins))
        for k, job, out, _ in jobs:
            assert vad.wait(job, 30_000) is StatusCode.SUCCESS, vad.last_error
            got[k].append(out)
    for k in range(4):
        same(backend, got[k], want[k])
    assert vad.stats["copies"] == 0


def test_streams_from_several_threads(backend, vad):
    inputs = [chunks(8, seed=20 + k) for k in range(4)]
    want = [by_hand(backend, xs) for xs in inputs]
    got: dict[int, list[np.ndarray]] = {}
    errors: list[str] = []

    def one_stream(k: int) -> None:
        try:
            s = vad.open_stream()
            got[k] = [s.run({"input": x, "sr": SR})["output"] for x in inputs[k]]
            assert s.close() is StatusCode.SUCCESS
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one_stream, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    for k in range(4):
        same(backend, got[k], want[k])


def test_openvino_stateful_model_streams(tmp_path):
    """ReadValue / Assign: OpenVINO keeps the state in a stream's own infer request."""
    from openvino._offline_transformations import apply_make_stateful_transformation

    pair_model = model_or_skip("silero_vad_openvino_16k")
    model = ov.Core().read_model(str(pair_model))
    apply_make_stateful_transformation(model, PAIR)
    xml = tmp_path / "vad_stateful.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    xs = chunks(6, seed=3)
    compiled = ov.Core().compile_model(str(pair_model), "CPU", ov_cpu_properties())
    request = compiled.create_infer_request()
    state = np.zeros((2, 1, 128), np.float32)
    want = []
    for x in xs:
        out = request.infer({"input": x, "state": state})
        want.append(out["output"].copy())
        state = out["stateN"].copy()
    with RunnerFactory.create_runner("OPENVINO", xml, {"device": "CPU"}) as r:
        assert [i.name for i in r.get_tensors_info(0, TensorType.CPU)] == ["input"]
        a, b = r.open_stream(), r.open_stream()
        got_a, got_b = [], []
        for x in xs:  # two streams interleaved, each with its own variables
            got_a.append(a.run({"input": x})["output"])
            got_b.append(b.run({"input": x})["output"])
        same("OPENVINO", got_a, want)
        same("OPENVINO", got_b, want)
        variables = a.state()
        assert list(variables) == [next(iter(variables))] and next(iter(variables.values())).shape == (2, 1, 128)
        np.testing.assert_allclose(next(iter(variables.values())), state, rtol=1e-4, atol=1e-5)
        assert a.reset() is StatusCode.SUCCESS
        same("OPENVINO", [a.run({"input": x})["output"] for x in xs], want)
        assert b.set_state({k: np.zeros((2, 1, 64), v.dtype) for k, v in variables.items()}) is not StatusCode.SUCCESS
        assert "does not fit the variable" in r.last_error  # the variable's declared shape is [2, 1, 128]
        assert b.set_state({k: np.zeros_like(v) for k, v in variables.items()}) is StatusCode.SUCCESS
        same("OPENVINO", [b.run({"input": x})["output"] for x in xs[:2]], want[:2])
