"""Real pretrained models for the tests, fetched once from PyPI wheels and cached (never committed).

The PP-OCRv4 detector / recogniser and the mobile direction classifier ship in ``rapidocr-onnxruntime``;
the stateful voice-activity model ships in ``silero-vad``. Each wheel is fetched with
``pip download --no-deps`` (no install, no dependencies) and the one file unzipped into
``$NPURT_MODEL_CACHE`` (default ``~/.cache/npurt/models``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

# name -> (pip requirement, file inside the wheel)
MODELS = {
    "ocr_cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "ocr_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ocr_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("NPURT_MODEL_CACHE", Path.home() / ".cache" / "npurt" / "models"))


def fetch(name: str) -> Path:
    """The path of a cached model, fetching its wheel on first use."""
    requirement, member = MODELS[name]
    target = cache_dir() / Path(member).name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, requirement],
                       check=True, timeout=600)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            partial = target.with_suffix(".part")
            partial.write_bytes(z.read(member))
            partial.replace(target)  # atomic: parallel test processes never see half a model
    return target


def model_or_skip(name: str) -> Path:
    try:
        return fetch(name)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"cannot fetch model {name} from PyPI: {e}")
