"""Model folders with text for the tests (issue 44): a test decoder (npurt.models.decoders) with a tokenizer trained
here (npurt.models.tokenizer_files) of its exact vocabulary and its pad / bos / eos ids, and the references the text
layer is checked against: transformers 5's AutoTokenizer (the test extra) on the same folder.

    folder = text_folder(root, "gqa", "bytelevel")     # model.onnx, genai_config.json, tokenizer.json, ...
    reference = auto_tokenizer(folder)                 # transformers' AutoTokenizer, offline
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from npurt.models.decoders import SHAPES
from npurt.models.tokenizer_files import write_tokenizer
from tests.helpers.decoders import decoder_folder
from tests.helpers.missing import require_module

# each kind of tokenizer on a test decoder of its own (the vocabulary sizes differ: 512, 640)
KIND_SHAPES = {"bytelevel": "gqa", "metaspace": "mha"}

TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog. Hello, world!",
    "latin1": "café naïve über señor Ångström façade crème brûlée ÿ ß æ ø",
    "cjk": "日本語のテキストを分割します。中文字符和标点，한국어 문장도 있습니다.",
    "emoji": "emoji 😀 👍🏽 🚀 👨‍👩‍👧 ✨ ❤️ 🇫🇷 and text after",
    "code": "def add(x, y):\n    return x + y\n\nfor i in range(10):\n    print(f\"{i}: {add(i, 1)}\")\n",
    "whitespace": "   leading\t\ttabs   and   runs  \n\n\n   of spaces \r\n trailing   ",
    "specials": "<s>text between</s> <|im_start|>user<|im_end|> <pad>",
    "rare": "xyz ẞ 𝔘 ﷺ ༀ ₿ ∮ ⅞ Ꙭ",
}


def text_folder(root: Path, shape: str, kind: str, chat_template: str | None = None, **options: Any) -> Path:
    """A folder under ``root`` with the ``shape`` decoder and a ``kind`` tokenizer of its vocabulary (built once per
    folder; ``chat_template``: written to chat_template.jinja, taking precedence over tokenizer_config.json's
    ChatML)."""
    folder = decoder_folder(Path(root) / kind, shape, **options)
    if not (folder / "tokenizer.json").is_file():
        write_tokenizer(folder, kind, SHAPES[shape].vocab)
    if chat_template is not None:
        (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return folder


def transformers() -> Any:
    """transformers (the test extra): a skip locally where it is missing, a failure in CI. Offline: nothing is
    fetched."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return require_module("transformers", "the text layer's reference is transformers' AutoTokenizer (extra 'test')")


def auto_tokenizer(folder: Path) -> Any:
    return transformers().AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
