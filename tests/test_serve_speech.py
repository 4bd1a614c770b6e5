"""npurt serve --transcribe (issue 58): OpenAI's /v1/audio/transcriptions over the real whisper tiny.en (optimum's
export, built from its wheel), driven by the official ``openai`` client and by plain HTTP.

The reference is the in-process Transcriber on the same folder, backend and threads: the server's text equals it in
every response format. Bad requests get OpenAI's error object with the right status while the server goes on
serving; more clients than --max-sequences and --max-queue allow get 429 with Retry-After, never a hang."""

from __future__ import annotations

import http.client
import io
import json
import threading
import uuid
import wave

import pytest

from tests.helpers.missing import require_module

openai = require_module("openai", "needs the 'test' extra (the official OpenAI client)")
require_module("aiohttp", "needs the 'serve' extra")
require_module("soundfile", "needs the 'speech' extra")

from npurt.serve.process import ServiceProcess  # noqa: E402
from npurt.speech import Transcriber  # noqa: E402
from tests.helpers.llm_serving import client  # noqa: E402
from tests.helpers.real_models import folder  # noqa: E402

SERVE = ["--backend", "onnxruntime", "--device", "CPU", "--threads", "1", "--max-sequences", "2", "--max-queue", "2",
         "--max-body-mb", "2"]


def _clip(name: str):
    return folder("speech-clips") / f"{name}.wav"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-speech")
    args = [*SERVE, "--http", "127.0.0.1:0", "--transcribe", f"tiny={folder('whisper-optimum')}"]
    with ServiceProcess.start({}, tmp / "serve.sock", args) as svc:
        yield svc


@pytest.fixture(scope="module")
def local():
    transcriber = Transcriber(folder("whisper-optimum"), "ONNXRUNTIME", "CPU", {"num_threads": 1})
    yield transcriber
    transcriber.close()


def _multipart(fields: dict[str, str], audio: bytes, filename: str = "a.wav") -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + audio + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _post(svc, fields: dict[str, str], audio: bytes, path: str = "/v1/audio/transcriptions"
          ) -> tuple[int, bytes, dict[str, str]]:
    body, content_type = _multipart(fields, audio)
    conn = http.client.HTTPConnection(*svc.http_address.rsplit(":", 1), timeout=120)
    conn.request("POST", path, body, {"Content-Type": content_type})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data, dict(response.getheaders())


def test_the_model_is_listed(server):
    assert [m.id for m in client(server).models.list().data] == ["tiny"]


@pytest.mark.parametrize("clip", ["fox", "meeting"])
def test_the_openai_client_gets_the_in_process_text(server, local, clip):
    want = local.transcribe(_clip(clip), temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), seed=0)
    with open(_clip(clip), "rb") as f:
        got = client(server).audio.transcriptions.create(model="tiny", file=f)
    assert got.text == want.text and want.text.strip()


def test_formats_text_srt_vtt_and_verbose_json(server, local):
    want = local.transcribe(_clip("question"), temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), timestamps=True, seed=0)
    c = client(server)
    with open(_clip("question"), "rb") as f:
        text = c.audio.transcriptions.create(model="tiny", file=f, response_format="text")
    assert text.strip() == local.transcribe(_clip("question")).text.strip()
    with open(_clip("question"), "rb") as f:
        verbose = c.audio.transcriptions.create(model="tiny", file=f, response_format="verbose_json",
                                                timestamp_granularities=["segment"])
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(s.start, s.end, s.text) for s in want.segments]
    assert verbose.duration == pytest.approx(want.duration)
    with open(_clip("question"), "rb") as f:
        srt = c.audio.transcriptions.create(model="tiny", file=f, response_format="srt")
    assert srt.startswith("1\n00:00:") and " --> " in srt and want.segments[0].text.strip() in srt
    with open(_clip("question"), "rb") as f:
        vtt = c.audio.transcriptions.create(model="tiny", file=f, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:") and want.segments[0].text.strip() in vtt


def test_streamed_text_comes_as_deltas_then_done(server, local):
    want = local.transcribe(_clip("battery"), temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), seed=0)
    with open(_clip("battery"), "rb") as f:
        events = list(client(server).audio.transcriptions.create(model="tiny", file=f, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == want.text


@pytest.mark.parametrize("audio, why", [
    (b"", "empty"),
    (b"this is not audio at all" * 100, "not audio"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "truncated"),
])
def test_bad_audio_gets_400_and_the_server_goes_on(server, audio, why):
    status, data, _ = _post(server, {"model": "tiny"}, audio)
    assert status == 400, (why, data)
    assert json.loads(data)["error"]["param"] == "file"
    status, data, _ = _post(server, {"model": "tiny", "response_format": "text"}, _clip("fox").read_bytes())
    assert status == 200 and data.strip()


@pytest.mark.parametrize("fields, param, status", [
    ({"model": "nope"}, "model", 404),
    ({"model": "tiny", "response_format": "xml"}, "response_format", 400),
    ({"model": "tiny", "temperature": "3"}, "temperature", 400),
    ({"model": "tiny", "timestamp_granularities[]": "word"}, "timestamp_granularities[]", 400),
    ({"model": "tiny", "language": "fr"}, "language", 400),  # an English-only model
    ({"model": "tiny", "frobnicate": "1"}, "frobnicate", 400),
])
def test_bad_fields_get_openais_error(server, fields, param, status):
    got, data, _ = _post(server, fields, _clip("fox").read_bytes())
    assert got == status, data
    assert json.loads(data)["error"]["param"] == param


def test_translations_on_an_english_only_model_are_refused(server):
    status, data, _ = _post(server, {"model": "tiny"}, _clip("fox").read_bytes(), "/v1/audio/translations")
    assert status == 400 and "English-only" in json.loads(data)["error"]["message"]


def test_a_body_over_the_cap_gets_413_in_openais_shape(server):
    frames = io.BytesIO()
    with wave.open(frames, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 16000 * 70)  # 70 s: 2.2 MB, over --max-body-mb 2
    status, data, _ = _post(server, {"model": "tiny"}, frames.getvalue())
    assert status == 413 and "error" in json.loads(data)


def test_many_clients_over_the_limits_get_429_with_retry_after_not_a_hang(server):
    audio = _clip("fox").read_bytes()
    answers: list[tuple[int, dict[str, str]]] = []
    lock = threading.Lock()

    def ask() -> None:
        status, _, headers = _post(server, {"model": "tiny", "response_format": "text"}, audio)
        with lock:
            answers.append((status, headers))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(answers) == 16
    statuses = sorted(s for s, _ in answers)
    assert set(statuses) == {200, 429} and statuses.count(200) >= 4, statuses
    assert all(h.get("Retry-After") for s, h in answers if s == 429)


def _speech_model(svc) -> dict:
    conn = http.client.HTTPConnection(*svc.http_address.rsplit(":", 1), timeout=30)
    conn.request("GET", "/v1/models")
    docs = json.loads(conn.getresponse().read())["data"]
    conn.close()
    return next(d for d in docs if d["id"] == "tiny")


def test_a_client_that_goes_away_mid_stream_frees_its_transcription(server):
    """The 51-s passage streamed: the client reads its first window's text and hangs up; the server ends the
    transcription at its next id (counted as cancelled) instead of decoding the second window for nobody."""
    before = _speech_model(server)
    body, content_type = _multipart({"model": "tiny", "stream": "true", "temperature": "0"},
                                    _clip("passage").read_bytes())
    conn = http.client.HTTPConnection(*server.http_address.rsplit(":", 1), timeout=120)
    conn.request("POST", "/v1/audio/transcriptions", body, {"Content-Type": content_type})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the first window's delta (chunked: decoded by readline)
    conn.sock.close()
    conn.close()
    for _ in range(200):
        now = _speech_model(server)
        if now["running"] == 0 and now["cancelled"] > before["cancelled"]:
            break
        threading.Event().wait(0.05)
    assert now["cancelled"] == before["cancelled"] + 1 and now["running"] == 0, now
