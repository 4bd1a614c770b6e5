"""A decoder's ONNX Runtime session defaults (issue 57 item 4): where nothing sets the threads, a runner with option
``decoder`` gives its session onnxruntime-genai's intra-op threads (half the CPUs, 1 to 16: its
Model::CreateSessionOptionsFromConfig), not ONNX Runtime's default (every physical core, spinning), which decoded at
about half the tokens/s on the 2-core VM. engine_settings say what the session runs with; option num_threads and
engine_options still win; a runner without option decoder keeps ONNX Runtime's default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npurt import RunnerFactory
from npurt.backends.onnxruntime import options as ort_options
from npurt.backends.onnxruntime.engine import OrtEngine
from npurt.backends.onnxruntime.options import decoder_threads
from npurt.options import NUM_THREADS_ENV
from npurt.runner import Runner
from tests.helpers.decoders import decoder_folder

EVERY_CORE = "0 (every physical core)"  # what engine_settings say for ONNX Runtime's own default


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decoder_folder(tmp_path_factory.mktemp("session-defaults"), "gqa") / "model.onnx"


@pytest.fixture(autouse=True)
def no_suite_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite caps every runner's threads through $NPURT_NUM_THREADS (tests/conftest.py): the defaults are what
    a runner gets without it."""
    monkeypatch.delenv(NUM_THREADS_ENV, raising=False)


def decoder_runner(backend: str, model: Path, **options: Any) -> Runner:
    return RunnerFactory.create_runner(backend, str(model), {"device": "CPU", "decoder": {"max_length": 64},
                                                             **options})


def session_options(runner: Runner) -> Any:
    """The options of the session the runner's engine runs (ONNX Runtime's own object)."""
    engine = runner.engine_for()
    assert isinstance(engine, OrtEngine)
    return engine.session.get_session_options()


def session_threads(runner: Runner) -> int:
    return int(session_options(runner).intra_op_num_threads)


def test_onnxruntime_genai_s_thread_count() -> None:
    # std::min(std::max(1, hardware_concurrency() / 2), 16)
    assert [decoder_threads(n) for n in (1, 2, 3, 4, 8, 16, 32, 33, 64, 256)] == [1, 1, 1, 2, 4, 8, 16, 16, 16, 16]


@pytest.mark.parametrize("backend", ["ONNXRUNTIME", "VAIML"])
def test_a_decoder_runs_with_onnxruntime_genai_s_threads(model: Path, backend: str) -> None:
    expected = decoder_threads(ort_options.cores())
    with decoder_runner(backend, model) as r:
        assert session_threads(r) == expected
        settings = dict(r.device_info.engine_settings)
        assert settings["intra_op_num_threads"] == str(expected)
        assert settings["allow_spinning"] == "1"  # ONNX Runtime's default, as onnxruntime-genai leaves it


def test_the_default_follows_the_cpus_the_process_may_use(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_options, "cores", lambda: 8)
    with decoder_runner("ONNXRUNTIME", model) as r:
        assert session_threads(r) == 4
        assert dict(r.device_info.engine_settings)["intra_op_num_threads"] == "4"


def test_num_threads_and_engine_options_win_over_the_decoder_default(model: Path) -> None:
    with decoder_runner("ONNXRUNTIME", model, num_threads=2) as r:
        assert session_threads(r) == 2 and dict(r.device_info.engine_settings)["intra_op_num_threads"] == "2"
    options = {"intra_op_num_threads": 0, "session.intra_op.allow_spinning": "0"}
    with decoder_runner("ONNXRUNTIME", model, num_threads=1, engine_options=options) as r:
        so = session_options(r)
        assert so.intra_op_num_threads == 0  # ONNX Runtime's own default, asked for
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        settings = dict(r.device_info.engine_settings)
        assert settings["intra_op_num_threads"] == EVERY_CORE and settings["allow_spinning"] == "0"


def test_the_thread_hint_still_shares_the_cores(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort_options, "cores", lambda: 8)
    with decoder_runner("ONNXRUNTIME", model, performance_hint="THROUGHPUT", max_concurrent_runs=4) as r:
        assert session_threads(r) == 2  # 8 cores over 4 runs, before the decoder's default
        assert dict(r.device_info.engine_settings)["allow_spinning"] == "0"


def test_a_runner_without_option_decoder_keeps_onnxruntime_s_default(model: Path) -> None:
    with RunnerFactory.create_runner("ONNXRUNTIME", str(model), {"device": "CPU"}) as r:
        assert session_threads(r) == 0
        settings = dict(r.device_info.engine_settings)
        assert settings["intra_op_num_threads"] == EVERY_CORE and settings["allow_spinning"] == "1"
