"""npurt serve --generate under load and at its edges (issue 45): a client that drops mid-stream, 64 clients against
4 caches (429 with Retry-After, every answer exact), the metrics, the command line's usage errors, the KServe
runtime's command line, the token and the drain on SIGTERM. The API itself is in tests/test_serve_generate.py.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers.missing import require_module

openai = require_module("openai", "needs the 'test' extra (the official OpenAI client)")
require_module("aiohttp", "needs the 'serve' extra")
require_module("tokenizers", "needs the 'text' extra")

from npurt.models import DEFAULT_MODEL  # noqa: E402
from npurt.serve.process import ServiceProcess  # noqa: E402
from tests.helpers.llm_serving import (  # noqa: E402
    ROOT,
    SERVE,
    client,
    folders,  # noqa: F401 - the module fixtures, shared with the other serve-generate module
    metric,
    metric_labels,
    metric_with_token,
    reference,  # noqa: F401
    server,  # noqa: F401
    sse,
    tokenizer,  # noqa: F401
)


def test_a_client_dropping_mid_stream_frees_its_sequence(server):
    """Three long streams share the caches with one that drops after its first chunk: it is freed long before its
    250 ids would have been made (counted as cancelled), and the others finish."""
    long = {"model": "lm", "prompt": [1] * 6, "max_tokens": 250, "temperature": 0.7, "seed": 1, "stream": True}
    cancelled = metric(server, "npurt_sequences_cancelled_total")
    failures = metric_labels(server, "npurt_generation_failures_total", 'api="completions",model="lm"')
    others = [threading.Thread(target=sse, args=(server, "/v1/completions", long)) for _ in range(3)]
    for t in others:
        t.start()
    host, port = server.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(long), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "
    conn.sock.close()  # gone mid-stream
    conn.close()
    deadline = time.monotonic() + 10
    while metric(server, "npurt_sequences_cancelled_total") == cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(server, "npurt_sequences_cancelled_total") == cancelled + 1
    deadline = time.monotonic() + 10  # its handler ends after the watch saw it
    while metric_labels(server, "npurt_generation_failures_total", 'api="completions",model="lm"') == failures:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for t in others:
        t.join(60)
    assert metric(server, "npurt_sequences_active") == 0
    got = client(server).completions.create(model="lm", prompt="still there", max_tokens=3, temperature=0)
    assert len(got.choices[0].token_ids) >= 1


def test_64_clients_against_4_caches(server, reference, tokenizer):
    """4 caches and 16 places in the queue: the others get 429 with Retry-After, every answer is exact, and the
    clients that retry (the openai client's own retries, honouring Retry-After) get theirs too."""
    prompts = [f"client {k} says hello" for k in range(64)]
    results: dict[int, object] = {}

    def one(k: int, retries: int) -> None:
        try:
            got = client(server, max_retries=retries).completions.create(model="lm", prompt=prompts[k],
                                                                         max_tokens=24, temperature=0)
            results[k] = got.choices[0].token_ids
        except openai.APIStatusError as e:
            results[k] = e

    threads = [threading.Thread(target=one, args=(k, 0)) for k in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    refused = [k for k, r in results.items() if isinstance(r, Exception)]
    assert len(results) == 64
    for k in refused:
        e = results[k]
        assert e.status_code == 429 and int(e.response.headers["Retry-After"]) >= 1, e
        assert e.body["type"] == "rate_limit_error"
    for k in refused:  # again, retrying as the client does on 429
        one(k, 20)
    for k in range(64):
        assert results[k] == reference.ids(tokenizer.encode(prompts[k]), 24), k
    assert metric(server, "npurt_sequences_queued") == 0


def test_metrics_count_tokens_and_time_them(server):
    client(server).completions.create(model="lm", prompt="count me", max_tokens=8, temperature=0)
    assert metric(server, "npurt_generated_tokens_total") >= 8
    assert metric(server, "npurt_time_to_first_token_seconds_count") >= 1
    assert metric(server, "npurt_inter_token_seconds_count") >= 7
    assert metric(server, "npurt_decode_step_rows_count") >= 7  # a run of steps per id but the first (alone here)
    assert metric(server, "npurt_sequences_active") == 0


# ---------------------------------------------------------------------------------------------------- the end
def test_command_line_usage_errors(folders, tmp_path):
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "npurt", "serve", "--socket", str(tmp_path / "s"), *args],
                              capture_output=True, text=True, timeout=120)

    r = serve("--generate", f"lm={folders['lm']}")
    assert r.returncode == 2 and "--http" in r.stderr
    r = serve("--model", f"digits={DEFAULT_MODEL}", "--max-sequences", "3")
    assert r.returncode == 2 and "--max-sequences is for language models" in r.stderr
    r = serve("--generate", f"lm={tmp_path / 'nothing'}", "--http", "127.0.0.1:0")
    assert r.returncode == 1 and "no such folder" in r.stderr
    r = serve("--generate", f"lm={folders['lm']}", "--http", "127.0.0.1:0", "--max-sequences", "0")
    assert r.returncode == 2 and "--max-sequences 0" in r.stderr
    r = serve("--generate", f"x={folders['lm']}", "--model", f"x={DEFAULT_MODEL}", "--http", "127.0.0.1:0")
    assert r.returncode == 2 and "given to --model and to --generate" in r.stderr
    r = serve("--model", f"digits={DEFAULT_MODEL}", "--batch", "2")
    assert r.returncode == 2 and "--batch is for language models" in r.stderr
    for bad in ("0", "2,x", "100"):
        r = serve("--generate", f"lm={folders['lm']}", "--http", "127.0.0.1:0", "--batch", bad)
        assert r.returncode == 2 and f"--batch {bad}:" in r.stderr, r.stderr
    r = serve("--generate", f"lm={folders['lm']}", "--http", "127.0.0.1:0", "--batch", "1,2", "--backend", "openvino")
    assert r.returncode == 2 and "OpenVINO" in r.stderr
    r = serve("--generate", f"lm={folders['lm']}", "--http", "127.0.0.1:0", "--batch", "2", "--no-batch")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


def test_the_kserve_runtime_s_command_line_serves_a_decoder_folder(folders, tmp_path):
    """deploy/llm-runtime.yaml's command, made loopback with a free port, its folder the test's decoder."""
    manifest = (ROOT / "deploy" / "llm-runtime.yaml").read_text()
    command = json.loads(re.search(r"^\s+command: (\[.*\])$", manifest, re.M).group(1))
    assert command[:2] == ["npurt", "serve"]
    args = command[2:]
    http = args[args.index("--http") + 1]
    assert f"containerPort: {http.rpartition(':')[2]}" in manifest and "path: /v2/health/ready" in manifest
    args[args.index("--http") + 1] = "127.0.0.1:0"
    assert args[args.index("--generate") + 1] == "model=/mnt/models"
    args[args.index("--generate") + 1] = f"model={folders['lm']}"
    k = args.index("--socket")
    del args[k:k + 2]  # ServiceProcess gives its own
    args.remove("--insecure")  # loopback: nothing crosses the network
    with ServiceProcess.start({}, tmp_path / "serve.sock", [*args, "--backend", "onnxruntime", "--device", "CPU",
                                                           "--threads", "1"]) as svc:
        got = client(svc).chat.completions.create(model="model", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=8, temperature=0)
        assert got.usage.completion_tokens >= 1
        with urllib.request.urlopen(f"http://{svc.http_address}/v2/health/ready", timeout=30) as r:
            assert r.status == 200


STREAMS = 32


def test_the_token_and_the_drain_on_sigterm(folders, tmp_path):
    args = [*SERVE, "--max-queue", "64", "--max-length", "256", "--http", "127.0.0.1:0", "--token", "s3cret",
            "--drain-timeout", "0.1", "--generate", f"lm={folders['lm']}"]
    with ServiceProcess.start({}, tmp_path / "serve.sock", args) as svc:
        with pytest.raises(openai.AuthenticationError) as e:
            client(svc).models.list()
        assert e.value.status_code == 401 and set(e.value.body) == {"message", "type", "param", "code"}
        with pytest.raises(urllib.error.HTTPError) as oip:  # the OIP routes answer 401 in their own shape
            urllib.request.urlopen(f"http://{svc.http_address}/v2/models/lm/ready", timeout=30)
        assert oip.value.code == 401 and isinstance(json.loads(oip.value.read())["error"], str)
        good = openai.OpenAI(base_url=f"http://{svc.http_address}/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in good.models.list().data] == ["lm"]
        started = threading.Event()
        outcomes: list[str] = []

        def long_stream() -> None:
            try:
                stream = good.completions.create(model="lm", prompt=[1] * 4, max_tokens=250, temperature=0.9,
                                                 seed=5, stream=True)
                reason = None
                for chunk in stream:
                    started.set()
                    reason = chunk.choices[0].finish_reason or reason
                outcomes.append(f"finished {reason}")
            except openai.APIError as e:
                outcomes.append(f"error {e.message}")

        threads = [threading.Thread(target=long_stream) for _ in range(STREAMS)]
        for t in threads:
            t.start()
        assert started.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and metric_with_token(svc, "npurt_sequences_active") + metric_with_token(
                svc, "npurt_sequences_queued") < STREAMS:  # every request taken (running or queued)
            time.sleep(0.01)
        svc.process.send_signal(signal.SIGTERM)
        probes: list[str] = []

        def probe() -> None:  # a new request: refused once the signal is seen (a loaded machine takes a while)
            try:
                good.completions.create(model="lm", prompt=[1, 2], max_tokens=1)
                probes.append("served")
            except openai.APIStatusError as e:
                probes.append(f"{e.status_code} {e.message}")
            except openai.APIConnectionError:
                probes.append("closed")

        deadline = time.monotonic() + 10
        while not any("shutting down" in p for p in probes) and time.monotonic() < deadline:
            threading.Thread(target=probe, daemon=True).start()  # admitted ones wait in the queue: not here
            time.sleep(0.01)
        assert any(p.startswith("503") and "shutting down" in p for p in probes), probes
        for t in threads:
            t.join(60)
        assert svc.process.wait(60) == 0  # the clean end of the drain (a second SIGTERM would race it)
    assert len(outcomes) == STREAMS
    cut = [o for o in outcomes if o.startswith("error")]
    assert cut, outcomes  # 32 x 250 ids do not fit the drain's 0.35 s (its grace and --drain-timeout)
    assert all("shut down" in o for o in cut), cut


def test_no_batch_steps_one_sequence_a_run(folders, tmp_path, reference, tokenizer):
    """--no-batch: the sequences interleave with a run per step (every run steps one row), each exact."""
    args = [*SERVE, "--http", "127.0.0.1:0", "--no-batch", "--generate", f"lm={folders['lm']}"]
    prompts = [f"unbatched {k} says" for k in range(4)]
    results: dict[int, list[int]] = {}
    with ServiceProcess.start({}, tmp_path / "serve.sock", args) as svc:
        def one(k: int) -> None:
            got = client(svc).completions.create(model="lm", prompt=prompts[k], max_tokens=24, temperature=0)
            results[k] = got.choices[0].token_ids

        threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        runs, rows = (metric(svc, f"npurt_decode_step_rows_{part}") for part in ("count", "sum"))
    assert rows == runs == sum(len(ids) - 1 for ids in results.values())  # a run per id fed (not the last)
    for k in range(4):
        assert results[k] == reference.ids(tokenizer.encode(prompts[k]), 24), k
