"""What the tests of npurt serve --generate share (tests/test_serve_generate*.py): the decoder folders (a text one
with a chat template that checks the role order, one of ids only, one with ChatML), the server's flags, the
in-process reference, and small HTTP helpers (plain requests, server-sent events, /metrics, /v1/models, embeddings
asked by concurrent clients: tests/test_serve_embed*.py too)."""

from __future__ import annotations

import http.client
import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npurt import Generator, RunnerFactory
from npurt.models import DEFAULT_MODEL
from npurt.models.decoders import build_decoder
from npurt.models.tokenizer_files import CHATML, write_tokenizer
from npurt.serve.process import ServiceProcess
from npurt.text.tokenizer import Tokenizer
from tests.helpers.decoders import decoder_folder

ROOT = Path(__file__).resolve().parents[2]
MAX_LENGTH, CHUNK = 256, 4
# ChatML with a system prompt first, then user / assistant in turn, as Mistral's and Llama 2's templates check it
ALTERNATING = (
    "{% if messages[0]['role'] == 'system' %}{% set rest = messages[1:] %}"
    "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{% else %}{% set rest = messages %}"
    "{% endif %}{% for message in rest %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# --prefix-reuse: the served set-up takes a chat's earlier turns from a free cache (off by default: test_real_chat)
SERVE = ["--backend", "onnxruntime", "--device", "CPU", "--threads", "1", "--max-length", str(MAX_LENGTH),
         "--prefill-chunk", str(CHUNK), "--max-sequences", "4", "--max-queue", "16", "--max-output-tokens", "32",
         "--prefix-reuse"]
OPTIONS = {"device": "CPU", "num_threads": 1, "decoder": {"max_length": MAX_LENGTH, "prefill_chunk": CHUNK}}


def make_folders(root: Path) -> dict[str, Path]:
    """The served decoders: "lm" (text, ALTERNATING), "ids" (no tokenizer; generation_config.json: greedy),
    "chatml" (text, ChatML); the same weights in all three."""
    text = root / "gqa-text"
    build_decoder(text, "gqa", 0)
    write_tokenizer(text, "bytelevel", 512, chat_template=ALTERNATING)
    plain = root / "chatml"
    build_decoder(plain, "gqa", 0)
    write_tokenizer(plain, "bytelevel", 512, chat_template=CHATML)
    ids = decoder_folder(root, "gqa")
    (ids / "generation_config.json").write_text(json.dumps({"do_sample": False, "eos_token_id": [2]}))
    return {"lm": text, "ids": ids, "chatml": plain}


class Reference:
    """The in-process Generator on a runner of the same folder and options."""

    def __init__(self, folder: Path) -> None:
        self.runner = RunnerFactory.create_runner("ONNXRUNTIME", folder / "model.onnx", OPTIONS)
        self.eos = self.runner.decoder.eos_token_ids
        self.lock = threading.Lock()

    def __enter__(self) -> Reference:
        return self

    def __exit__(self, *exc) -> None:
        self.runner.close()

    def ids(self, prompt: list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
            seed: int | None = None) -> list[int]:
        with self.lock, Generator(self.runner) as gen:
            return gen.generate(prompt, max_tokens, eos_token_id=self.eos, do_sample=temperature > 0,
                                temperature=temperature or 1.0, top_p=top_p, seed=seed)


def client(svc: Any, **kw: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=f"http://{svc.http_address}/v1", api_key="unused", **kw)


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode([t for t in ids if t != 2], skip_special_tokens=True)


def finish_of(ids: list[int], max_tokens: int) -> str:
    return "stop" if ids and ids[-1] == 2 else "length"


def first_model(svc: Any) -> dict:
    """The first entry of the server's ``GET /v1/models``."""
    with urllib.request.urlopen(f"http://{svc.http_address}/v1/models", timeout=30) as r:
        return dict(json.loads(r.read())["data"][0])


def embeddings_at_once(svc: Any, texts: list[str], model: str, **create: Any) -> np.ndarray:
    """Each text's embedding asked by a client of its own, all at once (``create``: the other arguments of
    ``embeddings.create``); the rows in the texts' order."""
    got: dict[int, np.ndarray] = {}

    def ask(i: int) -> None:
        answer = client(svc).embeddings.create(model=model, input=texts[i], **create)
        got[i] = np.asarray(answer.data[0].embedding)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return np.array([got[i] for i in range(len(texts))])


def post(svc, path: str, body, headers: dict | None = None) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{svc.http_address}{path}", data=data,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def sse(svc, path: str, body) -> list:
    """A streaming request's events, as JSON (and the "[DONE]" marker as the string)."""
    conn = http.client.HTTPConnection(*svc.http_address.rsplit(":", 1), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    assert response.getheader("Content-Type").startswith("text/event-stream")
    events = []
    for line in response.read().decode().split("\n\n"):
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    conn.close()
    return events


def raw_post(svc, path: str, body) -> tuple[int, dict]:
    """A request whose answer may be a stream (its events are not checked here) or a JSON document."""
    host, port = svc.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.getheader("Content-Type", "").startswith("text/event-stream"):
        return response.status, {}
    return response.status, json.loads(data)


def metric_with_token(svc, name: str) -> float:
    return metric(svc, name)  # /metrics is open, as Prometheus scrapes it


def metric_labels(svc, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"http://{svc.http_address}/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.search(rf'^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def metric(svc, name: str, model: str = "lm") -> float:
    with urllib.request.urlopen(f"http://{svc.http_address}/metrics", timeout=30) as r:
        text = r.read().decode()
    found = re.search(rf'^{re.escape(name)}{{model="{model}"}} (\S+)$', text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


# ------------------------------------------------------------------------------- the fixtures both test modules use
# (imported by name into tests/test_serve_generate.py and tests/test_serve_generate_limits.py: one served set-up)
@pytest.fixture(scope="module")
def folders(tmp_path_factory: Any) -> dict[str, Path]:
    return make_folders(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: Any) -> Any:
    """npurt serve with the digits model and the three decoders (--generate lm, ids, chatml), HTTP and gRPC."""
    tmp = tmp_path_factory.mktemp("serve")
    args = [*SERVE, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--generate", f"lm={folders['lm']}", "--generate",
            f"ids={folders['ids']}", "--generate", f"chatml={folders['chatml']}"]
    with ServiceProcess.start({"digits": DEFAULT_MODEL}, tmp / "serve.sock", args) as svc:
        svc.folders = folders
        yield svc


@pytest.fixture(scope="module")
def tokenizer(folders: dict[str, Path]) -> Any:
    return Tokenizer(folders["lm"])


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> Any:
    ref = Reference(folders["lm"])
    yield ref
    ref.runner.close()


def server_folder(svc: Any, name: str) -> Path:
    return Path(svc.folders[name])
