"""npurt serve --embed (issue 59): OpenAI's /v1/embeddings over the real all-MiniLM-L6-v2 (sentence-transformers'
ONNX folder, built from its wheel), driven by the official ``openai`` client and by plain HTTP.

The reference is sentence-transformers' own embeddings (the fixture's reference.json) and the in-process Embedder
on the same backend and threads: every vector the server gives is within 1e-5 of both, whatever the requests it was
batched with. Bad requests get OpenAI's error object with the right status while the server goes on serving."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.helpers.missing import require_module

openai = require_module("openai", "needs the 'test' extra (the official OpenAI client)")
require_module("aiohttp", "needs the 'serve' extra")
require_module("tokenizers", "needs the 'text' extra")

from npurt.embed import Embedder  # noqa: E402
from npurt.serve.process import ServiceProcess  # noqa: E402
from tests.helpers.llm_serving import client, embeddings_at_once, first_model, post  # noqa: E402
from tests.helpers.real_models import folder, reference  # noqa: E402

OPTIONS = {"num_threads": 1}
SERVE = ["--backend", "onnxruntime", "--device", "CPU", "--threads", "1", "--max-batch-tokens", "512",
         "--max-inputs", "64"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-embed")
    args = [*SERVE, "--http", "127.0.0.1:0", "--embed", f"minilm={folder('minilm-st')}"]
    with ServiceProcess.start({}, tmp / "serve.sock", args) as svc:
        yield svc


@pytest.fixture(scope="module")
def local():
    with Embedder(folder("minilm-st"), "ONNXRUNTIME", "CPU", OPTIONS) as embedder:
        yield embedder


def _close(got, want, tol: float = 1e-5) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol, np.abs(got - want).max()


def test_the_model_is_listed_with_its_dimensions(server):
    models = {m.id: m for m in client(server).models.list().data}
    assert set(models) == {"minilm"}
    assert models["minilm"].dimensions == 384 and models["minilm"].max_model_len == 256


def test_the_openai_client_gets_sentence_transformers_embeddings(server, local):
    ref = reference("minilm-st")
    # OpenAI's API refuses an empty string, and the server (without --auto-truncate) a text past the maximum length:
    # the reference has one of each (the next test sends the long one)
    kept = [i for i, t in enumerate(ref["texts"]) if t and len(local.tokenize(t, truncate=False)[0]) <= 256]
    assert len(kept) == len(ref["texts"]) - 2
    texts, want = [ref["texts"][i] for i in kept], np.asarray(ref["embeddings"])[kept]
    got = client(server).embeddings.create(model="minilm", input=texts)  # base64, as the client asks by default
    assert [d.index for d in got.data] == list(range(len(texts)))
    vectors = np.array([d.embedding for d in got.data])
    _close(vectors, want)
    _close(vectors, local.encode(texts), 1e-6)
    tokens = sum(len(ids) for ids in local.tokenize(texts))
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens
    one = client(server).embeddings.create(model="minilm", input=texts[0], encoding_format="float")
    _close(one.data[0].embedding, want[0])


def test_auto_truncate_cuts_as_sentence_transformers_does(tmp_path, local):
    ref = reference("minilm-st")
    long = [i for i, t in enumerate(ref["texts"]) if len(local.tokenize(t, truncate=False)[0]) > 256]
    assert long
    args = [*SERVE, "--http", "127.0.0.1:0", "--auto-truncate", "--embed", f"minilm={folder('minilm-st')}"]
    with ServiceProcess.start({}, tmp_path / "serve.sock", args) as svc:
        got = client(svc).embeddings.create(model="minilm", input=[ref["texts"][i] for i in long])
    _close([d.embedding for d in got.data], np.asarray(ref["embeddings"])[long])
    assert got.usage.prompt_tokens == 256 * len(long)


def test_base64_is_little_endian_float32(server):
    status, doc, _ = post(server, "/v1/embeddings", {"model": "minilm", "input": "hello", "encoding_format": "base64"})
    assert status == 200
    b64 = np.frombuffer(base64.b64decode(doc["data"][0]["embedding"]), "<f4")
    status, doc, _ = post(server, "/v1/embeddings", {"model": "minilm", "input": "hello"})
    assert np.array_equal(b64, np.asarray(doc["data"][0]["embedding"], np.float32))


def test_dimensions_gives_unit_vectors_of_the_first_dimensions(server, local):
    got = client(server).embeddings.create(model="minilm", input=["a cat on a mat", "stock prices"], dimensions=64)
    vectors = np.array([d.embedding for d in got.data])
    full = local.encode(["a cat on a mat", "stock prices"])[:, :64]
    _close(vectors, full / np.linalg.norm(full, axis=1, keepdims=True), 1e-6)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)


def test_token_id_inputs_equal_their_text(server, local):
    ids = local.tokenize(["token ids in, one vector out"])[0]
    by_ids = client(server).embeddings.create(model="minilm", input=[ids], encoding_format="float")
    by_text = client(server).embeddings.create(model="minilm", input="token ids in, one vector out",
                                               encoding_format="float")
    _close(by_ids.data[0].embedding, by_text.data[0].embedding, 1e-6)
    assert by_ids.usage.prompt_tokens == len(ids)


def test_concurrent_clients_share_runs_and_get_their_own_rows(server, local):
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'the stock market and its many moods'}"
             for i in range(24)]
    want = local.encode(texts)
    runs_before = first_model(server)["runs"]
    _close(embeddings_at_once(server, texts, "minilm", encoding_format="float"), want, 1e-6)
    doc = first_model(server)
    assert doc["runs"] - runs_before < len(texts), doc["recent_runs"]  # some runs served several clients
    assert max(requests for requests, _ in doc["recent_runs"]) > 1


@pytest.mark.parametrize("body, status, param", [
    ({"model": "minilm", "input": ""}, 400, "input"),
    ({"model": "minilm", "input": []}, 400, "input"),
    ({"model": "minilm", "input": ["x"] * 100_000}, 400, "input"),
    ({"model": "minilm", "input": "word " * 210_000}, 400, "input"),  # a 1-MB string: past 256 tokens
    ({"model": "minilm", "input": [[101, 30522, 102]]}, 400, "input"),  # past the vocabulary
    ({"model": "minilm", "input": ["a", 3]}, 400, "input"),
    ({"model": "minilm", "input": "x", "dimensions": 0}, 400, "dimensions"),
    ({"model": "minilm", "input": "x", "dimensions": 385}, 400, "dimensions"),
    ({"model": "minilm", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"model": "minilm", "input": "x", "n": 2}, 400, "n"),
    ({"model": "nope", "input": "x"}, 404, "model"),
])
def test_bad_requests_get_openais_error_and_the_server_goes_on(server, body, status, param):
    got, doc, _ = post(server, "/v1/embeddings", body)
    assert got == status, doc
    assert doc["error"]["param"] == param and doc["error"]["message"]
    ok, _, _ = post(server, "/v1/embeddings", {"model": "minilm", "input": "still serving"})
    assert ok == 200


def test_a_body_that_is_not_json_gets_400(server):
    got, doc, _ = post(server, "/v1/embeddings", b"{not json")
    assert got == 400 and "not JSON" in doc["error"]["message"]


def test_the_openai_client_sees_its_errors(server):
    with pytest.raises(openai.BadRequestError):
        client(server).embeddings.create(model="minilm", input="")
    with pytest.raises(openai.NotFoundError):
        client(server).embeddings.create(model="other", input="x")
