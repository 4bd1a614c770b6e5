"""npurt serve: runners of a service process, against in-process runners on the real PP-OCR classifier.

A runner from ``npurt.connect(...).open_runner(name)`` is an ``npurt.Runner``: its queries, results, statuses, job
machinery and stats must be those of a local runner of the same model and options. Faults, hostile clients, limits
and fairness are in tests/reliability/test_serve_faults.py; many clients at once in tests/test_serve_load.py.
"""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import npurt
from npurt import (
    InferQueue,
    JobHandle,
    MemoryType,
    NpuError,
    NpuTensor,
    RunnerFactory,
    StatusCode,
    TensorDirection,
    TensorType,
)
from npurt.options import parse_options
from npurt.serve import RemoteBackend
from npurt.serve.process import ServiceProcess
from tests.helpers.models import model_or_skip
from tests.helpers.ocr import SHAPES, frame

CLS_SHAPE = SHAPES["ocr_cls"]
OUT = "save_infer_model/scale_0.tmp_1"
SHAPE_FLAG = "x=" + ",".join(map(str, CLS_SHAPE))
LOCAL_OPTIONS = {"device": "CPU", "shapes": {"x": list(CLS_SHAPE)}, "num_threads": 1}


def start_service(tmp: Path, backend: str = "openvino", extra: tuple[str, ...] = ()) -> ServiceProcess:
    return ServiceProcess.start({"cls": model_or_skip("ocr_cls")}, tmp / "serve.sock",
                                ["--backend", backend, "--device", "CPU", "--shape", SHAPE_FLAG, "--threads", "1",
                                 *extra])


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with start_service(tmp_path_factory.mktemp("serve")) as svc:
        yield svc


@pytest.fixture
def client(service):
    with npurt.connect(service.socket_path) as c:
        yield c


def local_runner(backend: str = "OPENVINO") -> npurt.Runner:
    return RunnerFactory.create_runner(backend, model_or_skip("ocr_cls"), LOCAL_OPTIONS)


def tensors(runner: npurt.Runner, tensor_type: TensorType = TensorType.HW) -> tuple[NpuTensor, NpuTensor]:
    x = runner.allocate_npu_tensor(runner.get_tensors_info(TensorDirection.INPUT, tensor_type)[0])
    out = runner.get_tensors_info(TensorDirection.OUTPUT, tensor_type)[0]
    y = runner.allocate_npu_tensor(out if out.is_static else out.replace(shape=(1, 2)))
    return x, y


# ---------------------------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_results_equal_an_in_process_runner(backend, service, tmp_path):
    """execute, execute_async + wait, callbacks and run(): bit for bit the in-process runner's, on either backend
    (ONNX Runtime's classifier output is open-shaped: the service reports the shape each run wrote)."""
    svc = service if backend == "OPENVINO" else start_service(tmp_path, "vaiml")
    try:
        with npurt.connect(svc.socket_path) as c, c.open_runner("cls") as remote, local_runner(backend) as local:
            assert remote.runner_type == "SERVICE" and remote.device_info.attached == "CPU"
            assert dict(remote.device_info.engine_settings)["served_backend"] == backend
            rx, ry = tensors(remote)
            lx, ly = tensors(local)
            frames = [frame(CLS_SHAPE, seed) for seed in range(6)]
            ended = threading.Event()
            seen = []
            for k, f in enumerate(frames):
                rx.numpy()[...] = lx.numpy()[...] = f
                assert local.execute([[lx]], [[ly]]) is StatusCode.SUCCESS
                want = ly.result().copy()
                if k % 3 == 0:
                    assert remote.execute([[rx]], [[ry]]) is StatusCode.SUCCESS, remote.last_error
                elif k % 3 == 1:
                    job = remote.execute_async([[rx]], [[ry]])
                    assert job.status is StatusCode.SUCCESS and remote.wait(job, 30_000) is StatusCode.SUCCESS
                else:
                    ended.clear()
                    job = remote.execute_async([[rx]], [[ry]], lambda h: (seen.append(h), ended.set()))
                    assert ended.wait(30) and seen[-1] == JobHandle(StatusCode.SUCCESS, job.job_id)
                assert ry.result_info == ly.result_info
                np.testing.assert_array_equal(ry.result(), want)
                np.testing.assert_array_equal(remote.run({"x": f})[OUT], local.run({"x": f})[OUT])
            # run() copies its arrays into memory the service maps (the outputs come back mapped): nothing else
            assert remote.stats["copies"] == len(frames) and remote.stats["bytes_copied"] == sum(f.nbytes
                                                                                                  for f in frames)
            assert remote.stats["jobs_completed"] == 4 and remote.stats["execute_failures"] == 0
    finally:
        if svc is not service:
            svc.stop()


def test_queries_match_an_in_process_runner(client):
    with client.open_runner("cls") as remote, local_runner() as local:
        for direction in (TensorDirection.INPUT, TensorDirection.OUTPUT):
            for view in (TensorType.HW, TensorType.CPU):
                assert remote.get_tensors_info(direction, view) == local.get_tensors_info(direction, view)
        assert remote.get_tensor_info_by_name("x") == local.get_tensor_info_by_name("x")
        assert (remote.get_num_input_tensors(), remote.get_num_output_tensors(), remote.get_batch_size()) == (1, 1, 1)
        assert remote.input_specs == local.input_specs and remote.output_specs == local.output_specs
        assert remote.get_quant_parameters("x") is None
        info, mine = remote.device_info, local.device_info
        assert (info.attached, info.engine, info.engine_version, info.shape_mode, info.hw_view) == \
            (mine.attached, mine.engine, mine.engine_version, mine.shape_mode, mine.hw_view)
        with pytest.raises(ValueError, match="no tensor named 'nope'"):
            remote.get_tensor_info_by_name("nope")


def test_wrong_tensors_fail_as_they_do_locally(client):
    """Validation is the local runner's own: the same statuses and messages before anything reaches the service."""
    with client.open_runner("cls") as remote, local_runner() as local:
        for runner in (remote, local):
            x, y = tensors(runner)
            bad = runner.allocate_npu_tensor(x.info.replace(shape=(1, 4, 48, 192)))
            assert runner.execute([[bad]], [[y]]) is StatusCode.INVALID_INPUT
            assert runner.execute([[x]], [[x]]) is StatusCode.INVALID_OUTPUT
            assert runner.wait(12345, 0) is StatusCode.INVALID_JOB_ID
        assert remote.last_error == local.last_error


def test_user_memory_goes_through_counted_staging(client):
    """numpy memory has no fd: it reaches the service through a stand-in, one counted copy each way."""
    with client.open_runner("cls") as remote, local_runner() as local:
        f = frame(CLS_SHAPE, 7)
        x = NpuTensor(remote.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0], f.copy())
        out = np.zeros((1, 2), np.float32)
        y = NpuTensor(remote.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0], out)
        assert x.memory_type is MemoryType.USER_POINTER_NON_CMA
        for _ in range(2):
            assert remote.execute([[x]], [[y]]) is StatusCode.SUCCESS, remote.last_error
        np.testing.assert_array_equal(out, local.run({"x": f})[OUT])
        assert remote.stats["copies"] == 4 and remote.stats["bytes_copied"] == 2 * (f.nbytes + out.nbytes)
        rx, ry = tensors(remote)
        rx.numpy()[...] = f
        assert remote.execute([[rx]], [[ry]]) is StatusCode.SUCCESS
        assert remote.stats["copies"] == 4  # runner-allocated memory: zero copy


def test_wait_any_and_infer_queue_over_the_service(client):
    with client.open_runner("cls", {"max_concurrent_runs": 3}) as remote:
        pairs = [tensors(remote) for _ in range(3)]
        for k, (x, _) in enumerate(pairs):
            x.numpy()[...] = frame(CLS_SHAPE, k)
        jobs = [remote.execute_async([[x]], [[y]]) for x, y in pairs]
        assert all(j.status is StatusCode.SUCCESS for j in jobs)
        assert remote.max_concurrent_runs == 3  # the client's own job table (option max_concurrent_runs)
        done = set()
        while len(done) < 3:
            handle = remote.wait_any([j for j in jobs if j.job_id not in done], 30_000)
            assert handle.status is StatusCode.SUCCESS
            done.add(handle.job_id)
        results = {}
        queue = InferQueue(remote, 2)
        queue.set_callback(lambda slot, k: results.__setitem__(k, slot.outputs[0].result().copy()))
        for k in range(5):
            queue.start_async({"x": frame(CLS_SHAPE, k)}, k)
        queue.wait_all()
        with local_runner() as local:
            for k in range(5):
                np.testing.assert_array_equal(results[k], local.run({"x": frame(CLS_SHAPE, k)})[OUT])


# ---------------------------------------------------------------------------------------------- the service
def test_model_is_compiled_once_and_shared(service):
    with npurt.connect(service.socket_path) as a, npurt.connect(service.socket_path) as b:
        ra, rb = a.open_runner("cls"), b.open_runner("cls")
        xa, ya = tensors(ra)
        xb, yb = tensors(rb)
        assert ra.execute([[xa]], [[ya]]) is StatusCode.SUCCESS and rb.execute([[xb]], [[yb]]) is StatusCode.SUCCESS
        (model,) = a.models()
        assert model["name"] == "cls" and len(model["loaded"]) == 1  # one served runner for both
        assert a.stats()["service"]["clients"] >= 2 and a.server_pid == b.server_pid == service.pid
        ra.close()
        rb.close()


def slow_model(path: Path) -> Path:
    """Eight 256x1024 @ 1024x1024 products: a run of tens of milliseconds on one engine thread."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1024, 1024), np.float32) / 32, "w")
    nodes = [helper.make_node("MatMul", [f"h{k}" if k else "x", "w"], [f"h{k + 1}" if k < 7 else "y"])
             for k in range(8)]
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 1024])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), str(path))
    return path


def busy_threads(pid: int) -> dict[str, int]:
    """Context switches so far of each of a process's threads."""
    switches = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            lines = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
        except FileNotFoundError:
            continue
        switches[tid] = sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return switches


def test_the_thread_that_read_a_run_reads_next_and_others_read_meanwhile(tmp_path):
    # A client that waits for each answer is served by one thread of the service: the one that ran its last job
    # reads its next request (runs rotating over threads ran slower). A message that comes while a run is in
    # progress is still read at once, by another thread.
    models = {"cls": model_or_skip("ocr_cls"), "slow": slow_model(tmp_path / "slow.onnx")}
    with ServiceProcess.start(models, tmp_path / "serve.sock",
                              ["--backend", "openvino", "--device", "CPU", "--shape", "cls:" + SHAPE_FLAG,
                               "--threads", "1"]) as svc, npurt.connect(svc.socket_path) as client:
        with client.open_runner("cls") as runner:
            x, y = tensors(runner)
            assert runner.execute([[x]], [[y]]) is StatusCode.SUCCESS
            before = busy_threads(svc.pid)
            runs = 300
            for _ in range(runs):
                assert runner.execute([[x]], [[y]]) is StatusCode.SUCCESS
            after = busy_threads(svc.pid)
            serving = [tid for tid, n in after.items() if n - before.get(tid, 0) >= runs // 10]
            assert len(serving) == 1, f"threads of the service that took part in {runs} runs: {serving}"
        with client.open_runner("slow") as runner:
            x, y = tensors(runner)
            job = runner.execute_async([[x]], [[y]])
            assert job.status is StatusCode.SUCCESS
            in_flight = client.stats()["client"]["in_flight"]
            assert runner.wait(job) is StatusCode.SUCCESS
            assert in_flight == 1, "a query during a run was answered only after it"


def test_options_that_change_the_engine_get_a_runner_of_their_own(client):
    with client.open_runner("cls", {"input_tensor_type": "CPU", "output_tensor_type": "CPU"}) as remote:
        assert remote.get_port("x").view is TensorType.CPU
        x, y = tensors(remote, TensorType.CPU)
        x.numpy()[...] = frame(CLS_SHAPE, 1)
        assert remote.execute([[x]], [[y]]) is StatusCode.SUCCESS and remote.stats["copies"] == 0
    loaded = client.models()[0]["loaded"]
    assert any(entry["options"].get("input_tensor_type") == "CPU" for entry in loaded)


@pytest.fixture
def service_type():
    assert "SERVICE" not in RunnerFactory.available_backends()  # no engine: not registered unless asked
    RunnerFactory.register_backend("SERVICE", RemoteBackend)
    yield
    RunnerFactory.unregister_backend("SERVICE")


def test_runner_factory_service_type(service, service_type):
    options = {"service": str(service.socket_path), **LOCAL_OPTIONS}
    with RunnerFactory.create_runner("SERVICE", "cls", options) as remote, local_runner() as local:
        x, y = tensors(remote)
        x.numpy()[...] = frame(CLS_SHAPE, 3)
        assert remote.execute([[x]], [[y]]) is StatusCode.SUCCESS
        np.testing.assert_array_equal(y.numpy(), local.run({"x": frame(CLS_SHAPE, 3)})[OUT])
    # the service pins x's shape; a runner that leaves it open would report other ports: said, not guessed
    with pytest.raises(NpuError, match="shape_sets.*pass the same options"):
        RunnerFactory.create_runner("SERVICE", "cls", {"service": str(service.socket_path)})
    with pytest.raises(NpuError, match="by name"):
        RunnerFactory.create_runner("SERVICE", str(model_or_skip("ocr_cls")))


def test_bad_requests_are_clear_errors(client, tmp_path):
    with pytest.raises(ValueError, match=r"serves no model named 'nope'; it serves \['cls'\]"):
        client.open_runner("nope")
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        client.open_runner("cls", {"bogus": 1})
    with pytest.raises(NpuError, match="no npurt service listens at"):
        npurt.connect(tmp_path / "none.sock")
    with pytest.raises(ValueError, match="option 'service'"):
        parse_options({"service": 3})
    assert parse_options({"service": tmp_path / "s.sock"}).service == str(tmp_path / "s.sock")


def test_socket_is_private_and_the_service_says_ready(service):
    mode = stat.S_IMODE(os.stat(service.socket_path).st_mode)
    assert mode == 0o600
    out = service.output()
    assert f"READY {service.socket_path}" in out and "model cls" in out and "runs at once" in out


def test_cli_usage_errors(tmp_path):
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "npurt", "serve", "--socket", str(tmp_path / "s"), *args],
                              capture_output=True, text=True, timeout=120)

    r = serve()
    assert r.returncode == 2 and "--model" in r.stderr
    r = serve("--model", "cls")
    assert r.returncode == 2 and "expected NAME=PATH" in r.stderr
    r = serve("--model", f"cls={tmp_path / 'missing.onnx'}")
    assert r.returncode == 1 and "file not found" in r.stderr
    r = serve("--model", f"cls={model_or_skip('ocr_cls')}", "--shape", "y=1,2")
    assert r.returncode == 2 and "no served model has an input 'y'" in r.stderr


def test_engine_options_from_the_command_line_reach_the_served_runners(tmp_path):
    """--engine-option KEY=VALUE is option engine_options of every served runner (here OpenVINO's CPU pinning, the
    trade between one client's latency and several clients' throughput: docs/performance.md section 5)."""
    with start_service(tmp_path, extra=("--engine-option", "ENABLE_CPU_PINNING=NO")) as svc, \
            npurt.connect(svc.socket_path) as c, c.open_runner("cls") as remote:
        assert dict(remote.device_info.engine_settings)["ENABLE_CPU_PINNING"] == "NO"
        x, y = tensors(remote)
        assert remote.execute([[x]], [[y]]) is StatusCode.SUCCESS
        assert c.models()[0]["loaded"][0]["options"]["engine_options"] == {"ENABLE_CPU_PINNING": "NO"}


def test_sigterm_is_a_clean_shutdown(tmp_path):
    svc = start_service(tmp_path)
    with npurt.connect(svc.socket_path) as c:
        remote = c.open_runner("cls")
        x, y = tensors(remote)
        assert remote.execute([[x]], [[y]]) is StatusCode.SUCCESS
        assert svc.stop() == 0
        assert not svc.socket_path.exists()
        assert remote.execute([[x]], [[y]]) is StatusCode.FAILURE
        assert "shut down (SIGTERM received)" in remote.last_error
        remote.close()
    out = svc.output()
    assert "shutting down (SIGTERM received)" in out and "stopped" in out and "disconnected" in out


def test_streams_keep_their_state_in_the_service(tmp_path):
    """A model whose engine keeps variables (OpenVINO ReadValue / Assign): each client stream has a context of its
    own in the service; streams interleave, and their state is read, set and reset, as in one process. Carried
    pairs (option state_pairs) stay in the client's buffers."""
    import openvino as ov
    from openvino._offline_transformations import apply_make_stateful_transformation

    from tests.test_streams import PAIR, SR, chunks

    model = ov.Core().read_model(str(model_or_skip("silero_vad_openvino_16k")))
    apply_make_stateful_transformation(model, PAIR)
    xml = tmp_path / "vad_stateful.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    pair_model = model_or_skip("silero_vad_op18_ifless")
    xs = chunks(5, seed=4)
    with RunnerFactory.create_runner("OPENVINO", xml, {"device": "CPU"}) as local:
        want = [local.run({"input": x})["output"] for x in xs]
    with RunnerFactory.create_runner("OPENVINO", pair_model, {"device": "CPU", "state_pairs": PAIR}) as local:
        want_pairs = [local.run({"input": x, "sr": SR})["output"] for x in xs]
    with ServiceProcess.start({"vad": xml, "pairs": pair_model}, tmp_path / "s.sock",
                              ["--backend", "openvino", "--device", "CPU", "--threads", "1"]) as svc, \
            npurt.connect(svc.socket_path) as c:
        with c.open_runner("vad") as remote:
            a, b = remote.open_stream(), remote.open_stream()
            got_a, got_b = [], []
            for x in xs:
                got_a.append(a.run({"input": x})["output"])
                got_b.append(b.run({"input": x})["output"])
            for got in (got_a, got_b):
                np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), rtol=1e-4, atol=1e-5)
            (name, value), = a.state().items()
            assert value.shape == (2, 1, 128)
            assert a.reset() is StatusCode.SUCCESS
            np.testing.assert_allclose(a.run({"input": xs[0]})["output"], want[0], rtol=1e-4, atol=1e-5)
            assert b.set_state({name: np.zeros_like(value)}) is StatusCode.SUCCESS
            np.testing.assert_allclose(b.run({"input": xs[0]})["output"], want[0], rtol=1e-4, atol=1e-5)
            assert c.stats()["client"]["contexts"] == 2  # one per stream, in the service
            assert a.close() is StatusCode.SUCCESS and b.close() is StatusCode.SUCCESS
            assert c.stats()["client"]["contexts"] == 0
        with c.open_runner("pairs", {"state_pairs": PAIR}) as remote:
            s = remote.open_stream()
            got = [s.run({"input": x, "sr": SR})["output"] for x in xs]
            np.testing.assert_allclose(np.concatenate(got), np.concatenate(want_pairs), rtol=1e-4, atol=1e-5)
    del model
    gc.collect()  # OpenVINO's objects of the local runs hold the IR's weights file open until collected


def test_example_client_runs_against_the_service(service):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "examples" / "serve_client.py"), "--socket",
                           str(service.socket_path), "--model", "cls", "--runs", "20"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"service  pid {service.pid}" in out and "serving cls" in out and "backend OPENVINO" in out
    assert "output   save_infer_model/scale_0.tmp_1 [1, 2] float32" in out
    assert "async    20 jobs, callbacks: 20 SUCCESS" in out and "copies   0 (0 bytes)" in out
