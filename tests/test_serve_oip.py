"""npurt serve over KServe's Open Inference Protocol, driven by Triton's real clients (tritonclient.http and
tritonclient.grpc, unmodified): health, metadata, infer in JSON, binary and system shared memory (inputs and
outputs), several models, 8 concurrent clients, metrics. Results must equal an in-process runner's of the same model
and options. The server runs the container's command line (deploy/Containerfile), made loopback with free ports.
Bad requests, limits, authentication, TLS and the drain on SIGTERM are in tests/reliability/test_serve_faults.py.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.missing import require_module

tritonclient_http = require_module("tritonclient.http", "needs the 'serve' and 'test' extras")
tritonclient_grpc = require_module("tritonclient.grpc", "needs the 'serve' and 'test' extras")
shm = require_module("tritonclient.utils.shared_memory", "needs the 'serve' and 'test' extras")
from tritonclient.utils import InferenceServerException  # noqa: E402

from npurt import RunnerFactory  # noqa: E402
from npurt.models import DEFAULT_MODEL  # noqa: E402
from npurt.serve.process import ServiceProcess  # noqa: E402
from tests.helpers.models import model_or_skip  # noqa: E402
from tests.helpers.ocr import SHAPES, frame  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLS_SHAPE = SHAPES["ocr_cls"]
CLS_OUT = "save_infer_model/scale_0.tmp_1"
# the container's model path and its addresses, and what a test runs instead
CONTAINER_MODEL = "/mnt/models/model.onnx"


def container_command() -> list[str]:
    """deploy/Containerfile's ENTRYPOINT, which deploy/servingruntime.yaml's command must equal."""
    text = (ROOT / "deploy" / "Containerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    manifest = (ROOT / "deploy" / "servingruntime.yaml").read_text()
    command = json.loads(re.search(r"^\s+command: (\[.*\])$", manifest, re.M).group(1))
    assert command == entry, "the ServingRuntime's command differs from the container's"
    return entry


def test_runtime_manifest_probes_and_ports_match_the_command():
    command = container_command()
    http = command[command.index("--http") + 1]
    manifest = (ROOT / "deploy" / "servingruntime.yaml").read_text()
    port = http.rpartition(":")[2]
    assert f"containerPort: {port}" in manifest and "path: /v2/health/ready" in manifest
    assert re.search(rf"port: {port}\n", manifest)
    # the token from a Kubernetes Secret: the server refuses a bind beyond loopback without it
    assert re.search(r"- name: NPURT_SERVE_TOKEN\b.*\n\s+valueFrom:\n\s+secretKeyRef:", manifest)


def served_args(tmp: Path, extra: list[str] | None = None) -> tuple[dict[str, Path], list[str]]:
    """The container's command line as the tests run it: its flags, with loopback addresses on free ports, a
    socket of the test's, and the test's models (the container's one model is the digits model here)."""
    command = container_command()
    assert command[:2] == ["npurt", "serve"]
    args = command[2:]
    out: list[str] = []
    models: dict[str, Path] = {}
    k = 0
    while k < len(args):
        flag, value = args[k], args[k + 1] if k + 1 < len(args) else ""
        if value.startswith("--") or not value:  # a switch (--insecure)
            out.append(flag)
            k += 1
            continue
        if flag == "--model":
            name, _, path = value.partition("=")
            assert path == CONTAINER_MODEL
            models[name] = DEFAULT_MODEL
        elif flag in ("--http", "--grpc"):
            out += [flag, "127.0.0.1:0"]
        elif flag == "--socket":
            pass  # ServiceProcess gives its own
        else:
            out += [flag, value]
        k += 2
    return models, out + (extra or [])


OPTIONS = ["--backend", "openvino", "--device", "CPU", "--threads", "1"]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oip")
    models, args = served_args(tmp, OPTIONS + ["--shape", "cls:x=" + ",".join(map(str, CLS_SHAPE))])
    models["cls"] = model_or_skip("ocr_cls")
    with ServiceProcess.start(models, tmp / "serve.sock", args) as svc:
        assert svc.http_address and svc.grpc_address
        yield svc


@pytest.fixture(scope="module")
def local():
    """In-process runners of the same models and options: the reference."""
    runners = {"model": RunnerFactory.create_runner("OPENVINO", DEFAULT_MODEL, {"device": "CPU", "num_threads": 1}),
               "cls": RunnerFactory.create_runner("OPENVINO", model_or_skip("ocr_cls"),
                                                  {"device": "CPU", "num_threads": 1,
                                                   "shapes": {"x": list(CLS_SHAPE)}})}
    yield runners
    for r in runners.values():
        r.close()


def digits(seed: int, n: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32)


def want(local, model: str, x: np.ndarray) -> np.ndarray:
    name = "image" if model == "model" else "x"
    return next(iter(local[model].run({name: x}).values()))


def http_infer(client, model: str, x: np.ndarray, binary: bool = True) -> np.ndarray:
    name, out = ("image", "scores") if model == "model" else ("x", CLS_OUT)
    i = tritonclient_http.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    result = client.infer(model, [i], outputs=[tritonclient_http.InferRequestedOutput(out, binary_data=binary)])
    return result.as_numpy(out)


def grpc_infer(client, model: str, x: np.ndarray) -> np.ndarray:
    name, out = ("image", "scores") if model == "model" else ("x", CLS_OUT)
    i = tritonclient_grpc.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return client.infer(model, [i]).as_numpy(out)


def metrics(service) -> str:
    return urllib.request.urlopen(f"http://{service.http_address}/metrics", timeout=10).read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------------------------------------- health, metadata
def test_health_and_server_metadata(service):
    for client in (tritonclient_http.InferenceServerClient(service.http_address),
                   tritonclient_grpc.InferenceServerClient(service.grpc_address)):
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("cls") and client.is_model_ready("model", "1")
        assert not client.is_model_ready("nope")
    meta = tritonclient_http.InferenceServerClient(service.http_address).get_server_metadata()
    assert meta["name"] == "npurt" and {"binary_tensor_data", "system_shared_memory"} <= set(meta["extensions"])
    assert set(tritonclient_grpc.InferenceServerClient(service.grpc_address).get_server_metadata().extensions) == \
        set(meta["extensions"])


def test_model_metadata_is_the_runners_cpu_view(service, local):
    """Names, datatypes and shapes of the CPU views; -1 for the digits model's open batch dim."""
    http = tritonclient_http.InferenceServerClient(service.http_address)
    grpc = tritonclient_grpc.InferenceServerClient(service.grpc_address)
    digits_meta = http.get_model_metadata("model")
    assert digits_meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert digits_meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 10]}]
    assert http.get_model_metadata("cls", "1")["inputs"] == [{"name": "x", "datatype": "FP32",
                                                              "shape": list(CLS_SHAPE)}]
    g = grpc.get_model_metadata("cls")
    assert [(t.name, t.datatype, list(t.shape)) for t in g.outputs] == [(CLS_OUT, "FP32", [1, 2])]
    with pytest.raises(InferenceServerException, match="^.*Request for unknown model: 'nope' is not found"):
        http.get_model_metadata("nope")  # Triton's words: its clients match them
    with pytest.raises(InferenceServerException, match="version 7 is not found"):
        http.get_model_metadata("cls", "7")


# ---------------------------------------------------------------------------------------------- infer
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_infer_equals_the_in_process_runner(service, local, binary):
    client = tritonclient_http.InferenceServerClient(service.http_address)
    for seed in range(3):
        x = digits(seed, n=seed + 1)  # the open batch dim: 1, 2, 3
        np.testing.assert_array_equal(http_infer(client, "model", x, binary), want(local, "model", x))
        f = frame(CLS_SHAPE, seed)
        np.testing.assert_array_equal(http_infer(client, "cls", f, binary), want(local, "cls", f))


def test_http_infer_with_every_output_by_default(service, local):
    """No outputs named: every output, binary (tritonclient asks for binary_data_output)."""
    client = tritonclient_http.InferenceServerClient(service.http_address)
    x = digits(9)
    i = tritonclient_http.InferInput("image", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("model", [i], request_id="r-1")
    assert result.get_response()["id"] == "r-1"
    np.testing.assert_array_equal(result.as_numpy("scores"), want(local, "model", x))


def test_grpc_infer_equals_the_in_process_runner(service, local):
    client = tritonclient_grpc.InferenceServerClient(service.grpc_address)
    for seed in range(3):
        x = digits(seed, n=2)
        np.testing.assert_array_equal(grpc_infer(client, "model", x), want(local, "model", x))
        f = frame(CLS_SHAPE, seed)
        np.testing.assert_array_equal(grpc_infer(client, "cls", f), want(local, "cls", f))


def test_eight_concurrent_clients_over_both_protocols(service, local):
    """8 clients at once (4 HTTP, 4 gRPC, both models), each checking every answer against the local runner."""
    errors: list[str] = []
    frames = [frame(CLS_SHAPE, s) for s in range(4)]
    wanted = [want(local, "cls", f) for f in frames]
    xs = [digits(s) for s in range(4)]
    wanted_digits = [want(local, "model", x) for x in xs]

    def client(k: int) -> None:
        try:
            if k % 2:
                c = tritonclient_grpc.InferenceServerClient(service.grpc_address)
                infer = grpc_infer
            else:
                c = tritonclient_http.InferenceServerClient(service.http_address)
                infer = http_infer
            for n in range(12):
                j = (k + n) % 4
                if (k // 2 + n) % 2:
                    got, expected = infer(c, "cls", frames[j]), wanted[j]
                else:
                    got, expected = infer(c, "model", xs[j]), wanted_digits[j]
                if not np.array_equal(got, expected):
                    errors.append(f"client {k} request {n}: {got} != {expected}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:5]


# ---------------------------------------------------------------------------------------------- shared memory
@pytest.fixture
def regions(request):
    made = []

    def make(name: str, size: int):
        handle = shm.create_shared_memory_region(name, f"/npurt_test_{name}_{threading.get_native_id()}", size)
        made.append(handle)
        return handle, f"/npurt_test_{name}_{threading.get_native_id()}"

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_in_and_out(service, local, regions, protocol):
    """The input read from a region, the output written into one: equal to the local runner, and no copy of
    either by the server or the runner (npurt_serve_copies_total, npurt_runner_copies_total)."""
    mod = tritonclient_http if protocol == "http" else tritonclient_grpc
    client = mod.InferenceServerClient(service.http_address if protocol == "http" else service.grpc_address)
    f = frame(CLS_SHAPE, 5)
    in_handle, in_key = regions(f"in_{protocol}", f.nbytes)
    out_handle, out_key = regions(f"out_{protocol}", 4096)
    shm.set_shared_memory_region(in_handle, [f])
    client.unregister_system_shared_memory()
    client.register_system_shared_memory(f"in_{protocol}", in_key, f.nbytes)
    client.register_system_shared_memory(f"out_{protocol}", out_key, 4096)
    status = client.get_system_shared_memory_status()
    names = {r["name"] for r in status} if protocol == "http" else set(status.regions)
    assert names == {f"in_{protocol}", f"out_{protocol}"}
    before = metrics(service)
    for _ in range(2):
        i = mod.InferInput("x", list(CLS_SHAPE), "FP32")
        i.set_shared_memory(f"in_{protocol}", f.nbytes)
        o = mod.InferRequestedOutput(CLS_OUT)
        o.set_shared_memory(f"out_{protocol}", 8)
        result = client.infer("cls", [i], outputs=[o])
        got = shm.get_contents_as_numpy(out_handle, np.float32, [1, 2])
        np.testing.assert_array_equal(got, want(local, "cls", f))
        out = result.get_output(CLS_OUT)
        size = out["parameters"]["shared_memory_byte_size"] if protocol == "http" else \
            out.parameters["shared_memory_byte_size"].int64_param
        assert size == 8
        shm.set_shared_memory_region(out_handle, [np.zeros(2, np.float32)])
    after = metrics(service)
    for name in ("npurt_serve_copies_total", "npurt_runner_copies_total"):
        assert metric(after, name, model="cls") == metric(before, name, model="cls"), name
    client.unregister_system_shared_memory(f"in_{protocol}")
    client.unregister_system_shared_memory(f"out_{protocol}")
    with pytest.raises(InferenceServerException, match="no shared memory region"):
        i = mod.InferInput("x", list(CLS_SHAPE), "FP32")
        i.set_shared_memory(f"in_{protocol}", f.nbytes)
        client.infer("cls", [i])


def test_shared_memory_input_at_an_odd_offset_is_copied_once_and_counted(service, local, regions):
    f = frame(CLS_SHAPE, 6)
    handle, key = regions("odd", f.nbytes + 8)
    shm.set_shared_memory_region(handle, [np.frombuffer(f.tobytes(), np.uint8)], offset=1)
    client = tritonclient_http.InferenceServerClient(service.http_address)
    client.register_system_shared_memory("odd", key, f.nbytes + 8)
    try:
        before = metric(metrics(service), "npurt_serve_bytes_copied_total", model="cls")
        i = tritonclient_http.InferInput("x", list(CLS_SHAPE), "FP32")
        i.set_shared_memory("odd", f.nbytes, offset=1)
        result = client.infer("cls", [i])
        np.testing.assert_array_equal(result.as_numpy(CLS_OUT), want(local, "cls", f))
        assert metric(metrics(service), "npurt_serve_bytes_copied_total", model="cls") - before == f.nbytes
    finally:
        client.unregister_system_shared_memory("odd")


# ---------------------------------------------------------------------------------------------- metrics
def test_metrics_count_requests_failures_and_times(service):
    client = tritonclient_http.InferenceServerClient(service.http_address)
    before = metrics(service)
    http_infer(client, "model", digits(1))
    with pytest.raises(InferenceServerException):
        i = tritonclient_http.InferInput("image", [1, 1, 8, 9], "FP32")
        i.set_data_from_numpy(np.zeros((1, 1, 8, 9), np.float32))
        client.infer("model", [i])
    after = metrics(service)
    assert metric(after, "npurt_requests_total", model="model", protocol="http") - \
        metric(before, "npurt_requests_total", model="model", protocol="http") == 2
    assert metric(after, "npurt_request_failures_total", model="model", protocol="http") - \
        metric(before, "npurt_request_failures_total", model="model", protocol="http") == 1
    assert metric(after, "npurt_compute_seconds_count", model="model") > metric(
        before, "npurt_compute_seconds_count", model="model")
    for name in ("npurt_queue_seconds_bucket", "npurt_runner_copies_total", "npurt_runner_bytes_copied_total",
                 "npurt_jobs_total", "npurt_shm_regions"):
        assert name in after, name
