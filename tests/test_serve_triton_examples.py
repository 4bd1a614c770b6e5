"""Triton's own example client programs (tests/triton_examples, vendored unmodified: see its README) against
``npurt serve --http --grpc`` serving Triton's "simple" model, built here as an ONNX graph: INT32 [1, 16] INPUT0,
INPUT1 -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1. Each runs as a subprocess, as a user runs it; it
checks its own answers (sums, differences, error wording, statistics, configuration) and exits non-zero when one is
wrong. Only the health / metadata examples are patched, on their one line that checks that the server is named
"triton": npurt does not pretend to be Triton.

Then what the examples touch, checked here with figures: the statistics (Triton's schema, counts that follow the
requests, phases that add up), the model configuration derived from the model, the CUDA shared memory routes as a
server without GPUs answers them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.missing import require_module

httpclient = require_module("tritonclient.http", "needs the 'serve' and 'test' extras")
grpcclient = require_module("tritonclient.grpc", "needs the 'serve' and 'test' extras")
require_module("gevent", "Triton's HTTP examples need tritonclient[http] (the 'test' extra)")
require_module("aiohttp", "needs the 'serve' extra")
from tritonclient.utils import InferenceServerException  # noqa: E402

from npurt.serve.process import ServiceProcess  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent / "triton_examples"
ROOT = Path(__file__).resolve().parents[1]


def simple_model(path: Path) -> Path:
    """Triton's "simple" model as an ONNX graph."""
    import onnx
    from onnx import TensorProto, helper

    ports = [helper.make_tensor_value_info(n, TensorProto.INT32, [1, 16]) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, TensorProto.INT32, [1, 16]) for n in ("OUTPUT0", "OUTPUT1")]
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                               helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "simple", ports, outs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), str(path))
    return path


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton_examples")
    with ServiceProcess.start({"simple": simple_model(tmp / "simple.onnx")}, tmp / "serve.sock",
                              ["--backend", "openvino", "--device", "CPU", "--threads", "1",
                               "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]) as svc:
        assert svc.http_address and svc.grpc_address
        yield svc


# (example, protocol, extra arguments, a line it prints only when everything passed, or None)
CASES = [
    ("simple_http_infer_client", "http", [], None),
    ("simple_grpc_infer_client", "grpc", [], "PASS: infer"),
    ("simple_http_async_infer_client", "http", [], None),
    ("simple_grpc_async_infer_client", "grpc", [], "PASS: Async infer"),
    ("simple_http_aio_infer_client", "http", [], "PASS: infer"),
    ("simple_grpc_aio_infer_client", "grpc", [], "PASS: grpc aio infer"),
    ("simple_http_shm_client", "http", [], "PASS: system shared memory"),
    ("simple_grpc_shm_client", "grpc", [], "PASS: system shared memory"),
    ("reuse_infer_objects_client", "http", ["-i", "http"], None),
    ("reuse_infer_objects_client", "grpc", ["-i", "grpc"], None),
    ("simple_grpc_custom_args_client", "grpc", [], "PASS: CustomArgs"),
    ("simple_grpc_keepalive_client", "grpc", [], "PASS: KeepAlive"),
    ("grpc_explicit_int_content_client", "grpc", [], "PASS: explicit int"),
    ("simple_http_health_metadata", "http", [], None),
    ("simple_grpc_health_metadata", "grpc", [], None),
]
# the one line each health / metadata example has that checks the server's name: npurt is not Triton
NAME_CHECKS = {"simple_http_health_metadata": 'metadata["name"] == "triton"',
               "simple_grpc_health_metadata": 'metadata.name == "triton"'}


def example_path(name: str, tmp: Path) -> Path:
    path = EXAMPLES / f"{name}.py"
    check = NAME_CHECKS.get(name)
    if check is None:
        return path
    text = path.read_text()
    assert text.count(check) == 1, "the example changed: its server-name line is not where it was"
    patched = tmp / path.name
    patched.write_text(text.replace(check, check.replace('"triton"', '"npurt"')))
    return patched


@pytest.mark.parametrize(("name", "protocol", "extra", "passed"), CASES,
                         ids=[f"{c[0]}{'-' + c[2][1] if c[2] else ''}" for c in CASES])
def test_triton_example_passes_unmodified(service, tmp_path, name, protocol, extra, passed):
    url = service.http_address if protocol == "http" else service.grpc_address
    proc = subprocess.run([sys.executable, str(example_path(name, tmp_path)), "-u", url, *extra],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} failed:\n{out[-4000:]}\n--- server ---\n{service.output()[-2000:]}"
    for word in ("FAILED", "error", "Traceback"):
        assert word not in out, f"{name} printed {word!r}:\n{out[-4000:]}"
    if passed is not None:
        assert passed in out, out[-4000:]
    assert service.process.poll() is None, service.output()[-3000:]


# ---------------------------------------------------------------------------------------------- statistics
def simple_inputs(mod, data: np.ndarray):
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def test_statistics_follow_the_requests_in_tritons_schema(service):
    """Three good requests and one bad one: counts move by exactly that, each phase's time is positive, the phases
    of a request fit within its whole time; gRPC reports the same figures as HTTP."""
    http = httpclient.InferenceServerClient(service.http_address)
    grpc = grpcclient.InferenceServerClient(service.grpc_address)
    before = http.get_inference_statistics("simple")["model_stats"][0]
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(2):
        assert (http.infer("simple", simple_inputs(httpclient, data)).as_numpy("OUTPUT0") == data + 1).all()
    assert (grpc.infer("simple", simple_inputs(grpcclient, data)).as_numpy("OUTPUT1") == data - 1).all()
    bad = simple_inputs(httpclient, data)
    bad[1] = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    bad[1].set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException, match="datatype"):
        http.infer("simple", bad)
    after = http.get_inference_statistics("simple")["model_stats"][0]
    assert after["name"] == "simple" and after["version"] == "1"
    s0, s1 = before["inference_stats"], after["inference_stats"]
    assert set(s1) >= {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"}
    assert s1["success"]["count"] - s0["success"]["count"] == 3
    assert s1["fail"]["count"] - s0["fail"]["count"] == 1
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["last_inference"] > 0
    delta = {k: (s1[k]["count"] - s0[k]["count"], s1[k]["ns"] - s0[k]["ns"]) for k in s1}
    for phase in ("compute_input", "queue", "compute_infer", "compute_output"):
        assert delta[phase][0] == 3, phase
    for phase in ("success", "fail", "compute_input", "compute_infer", "compute_output"):
        assert delta[phase][1] > 0, (phase, delta)
    parts = sum(delta[k][1] for k in ("compute_input", "queue", "compute_infer", "compute_output"))
    assert parts <= delta["success"][1], delta
    print(f"\nstatistics of 3 requests (ns): {delta}")
    g = grpc.get_inference_statistics("simple").model_stats[0]
    assert g.name == "simple" and g.inference_count >= after["inference_count"]
    assert g.inference_stats.success.count >= s1["success"]["count"] and g.inference_stats.compute_infer.ns > 0
    everything = http.get_inference_statistics()["model_stats"]
    assert [m["name"] for m in everything] == ["simple"]
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        http.get_inference_statistics("nope")
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        grpc.get_inference_statistics("nope")


def test_model_configuration_is_derived_from_the_model(service):
    http = httpclient.InferenceServerClient(service.http_address)
    config = http.get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] == 0
    assert config["input"] == [{"name": n, "data_type": "TYPE_INT32", "dims": [1, 16]} for n in ("INPUT0", "INPUT1")]
    assert config["output"] == [{"name": n, "data_type": "TYPE_INT32", "dims": [1, 16]}
                                for n in ("OUTPUT0", "OUTPUT1")]
    g = grpcclient.InferenceServerClient(service.grpc_address).get_model_config("simple").config
    assert g.name == "simple" and g.platform == config["platform"] and g.max_batch_size == 0
    from tritonclient.grpc import model_config_pb2

    assert [(i.name, model_config_pb2.DataType.Name(i.data_type), list(i.dims)) for i in g.output] == \
        [(o["name"], o["data_type"], o["dims"]) for o in config["output"]]
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        http.get_model_config("nope")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_as_a_server_without_gpus(service, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(service.http_address if protocol == "http" else service.grpc_address)
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("anything")
    status = client.get_cuda_shared_memory_status()
    assert (status == [] if protocol == "http" else len(status.regions) == 0), status
    with pytest.raises(InferenceServerException, match="no CUDA devices"):
        client.register_cuda_shared_memory("r", b"\0" * 64, 0, 64)
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if protocol == "http" else list(meta.extensions)
    assert "cuda_shared_memory" not in extensions and {"statistics", "model_configuration"} <= set(extensions)


# ---------------------------------------------------------------------------------------------- strict JSON types
@pytest.mark.parametrize("bad", [1.9, -0.5, True, "7", 2 ** 31, -(2 ** 31) - 1, None],
                         ids=["1.9", "-0.5", "true", "'7'", "2^31", "-2^31-1", "null"])
def test_json_data_must_match_its_datatype(service, bad):
    """INT32 data takes integers within INT32's range: nothing truncated, wrapped or coerced (400, as Triton);
    the error is JSON with Content-Type exactly application/json."""
    import http.client
    import json

    values = list(range(15)) + [bad]
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": values},
                      {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [[1] * 16]}]}
    host, _, port = service.http_address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v2/models/simple/infer", body=json.dumps(doc).encode())
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 400, answer
        assert response.getheader("Content-Type") == "application/json"
        assert "INPUT0" in answer["error"] and "INT32" in answer["error"], answer
        doc["inputs"][0]["data"] = list(range(16))  # the same request with good data: nested lists are fine too
        conn.request("POST", "/v2/models/simple/infer", body=json.dumps(doc).encode())
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        assert answer["outputs"][0]["data"] == [v + 1 for v in range(16)]
    finally:
        conn.close()
