"""How npurt serve --embed gathers requests into runs (serve/embed/batcher.py) and answers them (routes.py), over the
real all-MiniLM-L6-v2 on ONNX Runtime: every request gets the rows its inputs give alone, whether its run was shared,
ran beside another run (``--hint throughput``: two one-thread runs at once), or its answer was made on the event
loop (small) or in a worker thread (large)."""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import pytest

from tests.helpers.missing import require_module

openai = require_module("openai", "needs the 'test' extra (the official OpenAI client)")
require_module("aiohttp", "needs the 'serve' extra")
require_module("tokenizers", "needs the 'text' extra")

from npurt.embed import Embedder  # noqa: E402
from npurt.serve.embed.batcher import TokenBatcher  # noqa: E402
from npurt.serve.embed.routes import INLINE_BASE64, INLINE_CHARS, INLINE_FLOATS, concurrent_runs  # noqa: E402
from npurt.serve.process import ServiceProcess  # noqa: E402
from tests.helpers.llm_serving import client, embeddings_at_once, first_model  # noqa: E402
from tests.helpers.real_models import folder  # noqa: E402

TEXTS = [f"sentence {i}: {'a cat sat on the mat' if i % 3 else 'the market rose, then fell, then rose again'}"
         for i in range(8)]


@pytest.fixture(scope="module")
def throughput():
    """The Embedder as ``--hint throughput`` makes it: two runs at once, one intra-op thread each."""
    with Embedder(folder("minilm-st"), "ONNXRUNTIME", "CPU", {"performance_hint": "THROUGHPUT"}) as embedder:
        yield embedder


def _timed(embedder: Embedder, spans: list[tuple[float, float, int]]):
    def run(ids):
        start = time.perf_counter()
        rows = embedder.encode_ids(ids)
        spans.append((start, time.perf_counter(), len(ids)))
        return rows
    return run


def test_the_throughput_hint_gives_two_runs_at_once_and_latency_one(throughput):
    assert concurrent_runs(throughput) == throughput.runner.max_concurrent_runs == 2
    with Embedder(folder("minilm-st"), "ONNXRUNTIME", "CPU", {"num_threads": 1}) as latency:
        assert concurrent_runs(latency) == 1


def test_free_threads_share_what_waits_and_each_request_gets_its_own_rows(throughput):
    ids = throughput.tokenize([f"{t} ({k})" for k in range(2) for t in TEXTS])  # runs long enough to overlap
    want = [throughput.encode_ids([i]) for i in ids]
    spans: list[tuple[float, float, int]] = []
    batcher = TokenBatcher("t", _timed(throughput, spans), 16384, 64, concurrent_runs=2)
    try:
        # held while submitting (the condition's lock is re-entrant): both threads are free when the 16 wait
        with batcher._cond:
            futures = [batcher.submit([i]) for i in ids]
        got = [f.result(timeout=60) for f in futures]
    finally:
        batcher.close("test over")
    for g, w in zip(got, want):
        assert g.shape == (1, 384)
        assert np.abs(g - w).max() <= 1e-6
    # the first thread took half the tokens waiting, the second the rest: two runs, neither all 16
    assert sorted(n for *_, n in spans) == sorted(len(r) for r in _halves(ids))
    assert batcher.runs == 2 and sum(requests for requests, _ in batcher.recent) == 16
    (s0, e0, _), (s1, e1, _) = sorted(spans)
    assert s1 < e0  # they ran at the same time


def _halves(ids: list[list[int]]) -> list[list[list[int]]]:
    """What the first of two free threads takes (its half of the tokens waiting, at least one request), and the
    rest: the split the batcher makes."""
    total = sum(len(i) for i in ids)
    taken, tokens = 0, 0
    while taken < len(ids) and (taken == 0 or tokens < -(-total // 2)):
        tokens += len(ids[taken])
        taken += 1
    return [ids[:taken], ids[taken:]]


def test_one_thread_runs_everything_waiting_together(throughput):
    ids = throughput.tokenize(TEXTS)
    spans: list[tuple[float, float, int]] = []
    batcher = TokenBatcher("t", _timed(throughput, spans), 16384, 64, concurrent_runs=1)
    try:
        with batcher._cond:
            futures = [batcher.submit([i]) for i in ids]
        for f in futures:
            f.result(timeout=60)
    finally:
        batcher.close("test over")
    assert [n for *_, n in spans] == [8] and list(batcher.recent) == [(8, 8)]


def _gated(embedder: Embedder, spans: list[tuple[float, float, int]], started: threading.Event,
           gate: threading.Event):
    """The real run, the first held until ``gate`` is set (a run in progress for as long as the test needs)."""
    timed = _timed(embedder, spans)

    def run(ids):
        if not started.is_set():
            started.set()
            assert gate.wait(timeout=60)
        return timed(ids)
    return run


def test_a_thread_free_beside_a_run_gathers_inputs_before_it_runs(throughput):
    ids = throughput.tokenize(TEXTS[:4])
    want = [throughput.encode_ids([i]) for i in ids]
    spans: list[tuple[float, float, int]] = []
    started, gate = threading.Event(), threading.Event()
    batcher = TokenBatcher("t", _gated(throughput, spans, started, gate), 16384, 64, concurrent_runs=2,
                           gather_inputs=3, gather_seconds=30)
    try:
        futures = [batcher.submit([ids[0]])]
        assert started.wait(timeout=60)  # the first run is in progress (held)
        for i in ids[1:]:  # one at a time, as clients send them: the free thread waits for the third
            futures.append(batcher.submit([i]))
            time.sleep(0.05)
        got = [f.result(timeout=60) for f in futures[1:]]
        assert [n for *_, n in spans] == [3]  # the three ran together, while the first was still held
        gate.set()
        got.insert(0, futures[0].result(timeout=60))
    finally:
        gate.set()
        batcher.close("test over")
    assert sorted(n for *_, n in spans) == [1, 3] and batcher.runs == 2
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-6


def test_a_gathering_thread_runs_at_once_when_the_run_beside_it_ends_and_a_lone_request_never_waits(throughput):
    ids = throughput.tokenize(TEXTS[:2])
    spans: list[tuple[float, float, int]] = []
    started, gate = threading.Event(), threading.Event()
    batcher = TokenBatcher("t", _gated(throughput, spans, started, gate), 16384, 64, concurrent_runs=2,
                           gather_inputs=8, gather_seconds=30)
    try:
        first = batcher.submit([ids[0]])
        assert started.wait(timeout=60)
        second = batcher.submit([ids[1]])
        time.sleep(0.2)
        assert not second.done()  # gathering: one input of the eight it waits for
        start = time.monotonic()
        gate.set()  # the run beside it ends: nothing to gather for, both threads free
        second.result(timeout=60), first.result(timeout=60)
        assert time.monotonic() - start < 10  # not the 30 s gathering window
        start = time.monotonic()
        batcher.submit([ids[0]]).result(timeout=60)  # alone: no run beside it, no wait
        assert time.monotonic() - start < 10
    finally:
        gate.set()
        batcher.close("test over")


def test_gathering_settings_are_checked(throughput):
    for inputs, seconds in ((0, 0.004), (3, -1.0), (3, 100.0)):
        with pytest.raises(ValueError, match="gather"):
            TokenBatcher("t", throughput.encode_ids, 16384, 64, concurrent_runs=2, gather_inputs=inputs,
                         gather_seconds=seconds)


def test_a_run_that_fails_tells_its_requests_and_the_threads_go_on(throughput):
    batcher = TokenBatcher("t", throughput.encode_ids, 16384, 64, concurrent_runs=2)
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            batcher.submit([[101, throughput.vocab_size, 102]]).result(timeout=60)
        ok = batcher.submit(throughput.tokenize(["still running"])).result(timeout=60)
        assert ok.shape == (1, 384)
    finally:
        batcher.close("test over")


def test_concurrent_runs_must_be_positive(throughput):
    with pytest.raises(ValueError, match="concurrent_runs"):
        TokenBatcher("t", throughput.encode_ids, 16384, 64, concurrent_runs=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-embed-throughput")
    args = ["--backend", "onnxruntime", "--device", "CPU", "--hint", "throughput", "--max-inputs", "64",
            "--http", "127.0.0.1:0", "--embed", f"minilm={folder('minilm-st')}"]
    with ServiceProcess.start({}, tmp / "serve.sock", args) as svc:
        yield svc


def test_a_throughput_server_serves_concurrent_clients_exactly(server, throughput):
    assert first_model(server)["concurrent_runs"] == 2
    texts = [f"{t} (client {k})" for k in range(3) for t in TEXTS]
    want = throughput.encode(texts)
    assert np.abs(embeddings_at_once(server, texts, "minilm") - want).max() <= 1e-6  # (base64: the client's default)


@pytest.mark.parametrize("encoding, count", [("float", 2), ("float", 48), ("base64", 48)])
def test_answers_made_on_the_loop_or_in_a_worker_thread_equal_the_in_process_ones(server, throughput, encoding,
                                                                                   count):
    texts = [f"{t}, number {k}" for k in range(6) for t in TEXTS][:count]
    limit = INLINE_BASE64 if encoding == "base64" else INLINE_FLOATS
    assert (count * 384 > limit) == (count == 48)  # 48: made in a worker thread
    got = client(server).embeddings.create(model="minilm", input=texts, encoding_format=encoding)
    assert [d.index for d in got.data] == list(range(len(texts)))
    # the client decodes base64 only where it chose it itself (the argument left out)
    vectors = [np.frombuffer(base64.b64decode(d.embedding), "<f4") if encoding == "base64" else d.embedding
               for d in got.data]
    assert np.abs(np.array(vectors) - throughput.encode(texts)).max() <= 1e-6


def test_a_long_text_is_tokenized_in_a_worker_thread(server, throughput):
    text = "word " * max(INLINE_CHARS // 5 + 1, 300)  # past INLINE_CHARS and 256 tokens: refused, as OpenAI does
    tokens = len(throughput.tokenize(text, truncate=False)[0])
    with pytest.raises(openai.BadRequestError, match=f"{tokens} tokens; model 'minilm' takes at most 256"):
        client(server).embeddings.create(model="minilm", input=text)
    text = "the quick brown fox. " * 10 + "x" * (INLINE_CHARS + 1)  # past INLINE_CHARS, within 256 tokens ([UNK])
    ids = throughput.tokenize(text, truncate=False)[0]
    assert len(ids) <= 256
    got = client(server).embeddings.create(model="minilm", input=text)
    assert np.abs(np.asarray(got.data[0].embedding) - throughput.encode(text)).max() <= 1e-6
    assert got.usage.prompt_tokens == len(ids)


def test_served_embedding_models_take_the_throughput_hint_unless_told():
    """``npurt serve --embed`` gives its embedding runners the THROUGHPUT hint (a run per core at once) unless
    --hint or --threads says how to run them."""
    from npurt.cli import build_parser
    from npurt.cli.serve import embedding_options

    def options(*flags: str) -> dict:
        return embedding_options(build_parser().parse_args(["serve", "--embed", "m=/nowhere", *flags]))

    assert options()["performance_hint"] == "THROUGHPUT"
    assert options("--hint", "latency")["performance_hint"] == "LATENCY"
    assert "performance_hint" not in options("--threads", "2")
