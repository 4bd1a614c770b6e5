"""`npurt transcribe DIR FILE...`: text, --json (text, segments, ids per file), srt and vtt, and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers.real_models import folder, reference


def npurt(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npurt", *args], capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("npurt")]
    assert len(lines) == 1 and lines[0].startswith("npurt: error: "), proc.stderr
    return lines[0]


def _json(text: str) -> dict:  # (an editable install may print its rebuild log first)
    return json.loads(text[text.index("{"):])


def test_usage_errors_need_no_model(tmp_path: Path) -> None:
    line = one_error_line(npurt("transcribe", str(tmp_path / "nowhere"), str(tmp_path / "a.wav")))
    assert "not a folder" in line
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    line = one_error_line(npurt("transcribe", str(tmp_path), str(tmp_path / "a.wav")))
    assert "no encoder_model.onnx" in line
    line = one_error_line(npurt("transcribe", str(tmp_path), str(tmp_path / "missing.wav")))
    assert "audio file not found" in line
    proc = npurt("transcribe", str(tmp_path), str(tmp_path / "a.wav"), "--format", "doc")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_json_srt_and_a_bad_file(tmp_path: Path) -> None:
    model = folder("whisper-optimum")
    clips = folder("speech-clips")
    expected = {c["clip"]: c["ct2_ids"] for c in reference("whisper-optimum")["clips"]}
    fox, question = clips / "fox.wav", clips / "question.wav"
    proc = npurt("transcribe", str(model), str(fox), str(question), "--json", "--backend", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    out = _json(proc.stdout)
    assert out["backend"] == "ONNXRUNTIME"
    assert [f["file"] for f in out["files"]] == [str(fox), str(question)]
    for entry, name in zip(out["files"], ("fox", "question"), strict=True):
        assert entry["ids"] == expected[name]
        assert set(entry) >= {"text", "segments", "ids"}
        assert entry["segments"][0]["start"] == 0.0 and entry["segments"][0]["text"].strip()

    # subtitles (timestamps on), and a file that is no audio: the others are still transcribed, then one error
    (tmp_path / "noise.bin").write_bytes(np.random.default_rng(0).bytes(4000))
    srt = npurt("transcribe", str(model), str(question), str(tmp_path / "noise.bin"), "--format", "srt",
                "--backend", "openvino")
    assert re.search(r"^1\n00:00:00,\d{3} --> 00:00:0\d,\d{3}\n\S", srt.stdout, re.M), srt.stdout
    assert "train station" in srt.stdout
    line = one_error_line(srt)
    assert "1 of 2 files could not be transcribed" in line and "not audio that libsndfile reads" in line


def test_subtitle_formats() -> None:
    from npurt.cli.transcribe import subtitles
    from npurt.speech import Segment

    segments = [Segment(0.0, 2.5, " Hello there.", ()), Segment(3661.25, 3662.0, " Bye.", ())]
    assert subtitles(segments, "srt") == ("1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
                                          "2\n01:01:01,250 --> 01:01:02,000\nBye.\n")
    assert subtitles(segments, "vtt").startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n")
