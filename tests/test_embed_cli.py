"""`npurt embed`, driven as a user drives it (`python -m npurt embed ...` in a subprocess), on a random-weight BERT
folder: texts from the arguments, a file or stdin; --json and --npy hold what npurt.Embedder gives in process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from npurt import Embedder
from npurt.models.bert import write_bert

TEXTS = ["hello world", "kaloru mine tion pre con ex", "the quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_bert(tmp_path_factory.mktemp("cli") / "bert", prompts={"query": "query: "})


def npurt(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npurt", "embed", *args], capture_output=True, text=True,
                          input=stdin, timeout=120)


def test_json_npy_and_the_summary_hold_the_embedders_numbers(model, tmp_path):
    with Embedder(model, "VAIML", "CPU") as embedder:
        want = embedder.encode(TEXTS)
        want_query = embedder.encode(TEXTS, prompt_name="query", truncate_dim=8, normalize=True)
        want_binary = embedder.encode(TEXTS, precision="ubinary")
    proc = npurt(str(model), *TEXTS, "--json", "--backend", "vaiml", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.array(json.loads(proc.stdout[proc.stdout.index("["):]), np.float32), want)
    (tmp_path / "texts.txt").write_text("\n".join([TEXTS[0], "", TEXTS[1], TEXTS[2]]) + "\n")  # a blank line: skipped
    proc = npurt(str(model), "--file", str(tmp_path / "texts.txt"), "--npy", str(tmp_path / "out.npy"), "--backend",
                 "openvino", "--prompt-name", "query", "--truncate-dim", "8", "--normalize")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want_query, atol=1e-5)
    assert "Backend  OPENVINO" in proc.stdout and "Output   [3, 8] float32 saved to" in proc.stdout
    proc = npurt(str(model), "--precision", "ubinary", "--bucket", "4x16", "--bucket", "1x512", "--backend",
                 "onnxruntime", stdin="\n".join(TEXTS))
    assert proc.returncode == 0, proc.stderr
    assert "batches: [1, 16], [4, 16], [1, 512]" in proc.stdout and "[3, 16]" not in proc.stdout
    assert "Output   [3, 4] uint8" in proc.stdout and "1 batches: [4, 16]" in proc.stdout
    assert f"[0] {', '.join(str(v) for v in want_binary[0])}, ..." in proc.stdout


def test_bad_input_is_one_line(model, tmp_path):
    for args, stdin, text in [
        ((str(tmp_path / "none"), "x"), None, "no embedding model folder or file at"),
        ((str(model), "x", "--prompt-name", "doc"), None, "prompt_name 'doc': bert has the prompts ['query']"),
        ((str(model),), "\n\n", "no texts in stdin"),
        ((str(model), "--file", str(tmp_path / "missing.txt")), None, "cannot read it"),
    ]:
        proc = npurt(*args, "--backend", "onnxruntime", stdin=stdin)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("npurt")]
        assert len(lines) == 1 and lines[0].startswith("npurt: error: ") and text in lines[0], proc.stderr
