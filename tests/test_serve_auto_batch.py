"""`npurt serve --backend auto` decides batched steps by the backend the decoder loaded on (issue 57, item 6): it
decided by the first backend AUTO tries, so a decoder that OpenVINO could not load (here: on the NPU, which npurt's
decoder does not drive on OpenVINO) ran unbatched on ONNX Runtime while the log said "OPENVINO does not batch steps";
and `--batch` under AUTO was refused for OpenVINO's sake although another backend would take it."""

from __future__ import annotations

import re
import threading

import pytest

from tests.helpers.missing import require_module

require_module("aiohttp", "needs the 'serve' extra")

from npurt import Generator, RunnerFactory  # noqa: E402
from npurt.factory import auto_order  # noqa: E402
from npurt.serve.process import ServiceProcess  # noqa: E402
from tests.helpers.decoders import MODEL_FILE, PROMPT, decoder_folder  # noqa: E402
from tests.helpers.llm_serving import metric, post  # noqa: E402

MAX_LENGTH, CHUNK = 128, 4
ONNX_RUNTIME = ("VAIML", "QNN", "ONNXRUNTIME")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return decoder_folder(tmp_path_factory.mktemp("auto"), "gqa")  # ids only (no tokenizer)


def serve(folder, tmp_path, *flags: str) -> ServiceProcess:
    return ServiceProcess.start({}, tmp_path / "serve.sock", [
        "--backend", "auto", "--threads", "1", "--max-length", str(MAX_LENGTH), "--prefill-chunk", str(CHUNK),
        "--max-sequences", "4", "--http", "127.0.0.1:0", "--generate", f"lm={folder}", *flags])


def reference(folder, prompt: list[int], n: int) -> list[int]:
    options = {"device": "CPU", "decoder": {"max_length": MAX_LENGTH, "prefill_chunk": CHUNK}}
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE, options) as r, Generator(r) as gen:
        return gen.generate(prompt, n, eos_token_id=r.decoder.eos_token_ids)


def batched(log: str) -> str:
    """Why the start-up log line says the steps are batched ('--batch auto on VAIML', '--batch'; '' where they are
    not)."""
    found = re.search(r"language model lm .*steps batched up to \d+ rows a run \([^)]*\) \(([^)]*)\)", log)
    return found.group(1) if found else ""


def openvino_first() -> None:
    """These cases are about OpenVINO being the backend AUTO tries first (where no backend sees an NPU)."""
    order = auto_order()
    if not order or order[0][0] != "OPENVINO":
        pytest.skip(f"AUTO tries {order[0][0] if order else 'nothing'} first here, not OPENVINO")


def test_a_decoder_openvino_cannot_load_runs_batched_on_the_backend_that_loads_it(folder, tmp_path):
    """--device NPU: OpenVINO refuses a decoder on its NPU, AUTO goes on to an ONNX Runtime backend (the NPU absent
    here: its CPU, with the fallback), and its steps are batched there: concurrent requests share runs, and each
    answer is the in-process Generator's."""
    openvino_first()
    with serve(folder, tmp_path, "--device", "NPU") as svc:
        log = svc.output()
        assert batched(log) in {f"--batch auto on {name}" for name in ONNX_RUNTIME}, log
        assert "OPENVINO does not batch" not in log and "OPENVINO could not load it" in log, log
        prompts = [[1, 17, 42 + k, 99, 7] for k in range(4)]
        answers: dict[int, list[int]] = {}

        def ask(k: int) -> None:
            status, body, _ = post(svc, "/v1/completions", {"model": "lm", "prompt": prompts[k], "max_tokens": 24,
                                                            "temperature": 0})
            answers[k] = body["choices"][0]["token_ids"] if status == 200 else body

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for k, prompt in enumerate(prompts):
            assert answers[k] == reference(folder, prompt, 24), k
        # some run stepped more than one sequence (4 requests of 24 ids at once: they overlap)
        assert metric(svc, "npurt_decode_step_rows_sum", "lm") > metric(svc, "npurt_decode_step_rows_count", "lm")


def test_batch_under_auto_skips_openvino_and_runs_where_it_batches(folder, tmp_path):
    """--batch 1,2 under AUTO on the CPU: OpenVINO (first in AUTO's order here, and able to load the decoder) does
    not batch, so AUTO goes on to the next backend, which does; the answer is the Generator's."""
    openvino_first()
    with serve(folder, tmp_path, "--device", "CPU", "--batch", "1,2") as svc:
        log = svc.output()
        assert batched(log) == "--batch" and "steps batched up to 2 rows a run" in log, log
        assert re.search(r"--backend auto: .*OPENVINO could not load it: --batch: OpenVINO", log), log
        status, body, _ = post(svc, "/v1/completions", {"model": "lm", "prompt": PROMPT, "max_tokens": 8,
                                                        "temperature": 0})
        assert status == 200 and body["choices"][0]["token_ids"] == reference(folder, PROMPT, 8)


def test_auto_on_the_cpu_keeps_openvino_and_says_it_does_not_batch(folder, tmp_path):
    """Where OpenVINO loads the decoder under AUTO (the CPU, --batch auto), it serves it, one sequence a run, and the
    log says so (nothing else changes AUTO's choice)."""
    openvino_first()
    with serve(folder, tmp_path, "--device", "CPU") as svc:
        log = svc.output()
        assert batched(log) == "" and "OPENVINO does not batch steps" in log, log
        status, body, _ = post(svc, "/v1/completions", {"model": "lm", "prompt": PROMPT, "max_tokens": 8,
                                                        "temperature": 0})
        assert status == 200 and body["choices"][0]["token_ids"] == reference(folder, PROMPT, 8)
