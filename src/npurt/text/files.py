"""What a model folder says about text, read as transformers reads it (no network, ever): the files beside the model.

- ``tokenizer.json``: the tokenizer itself (HF ``tokenizers``' serialization);
- ``tokenizer_config.json``: the named special tokens, ``added_tokens_decoder``, ``chat_template`` (a string, or a
  list of named templates), ``clean_up_tokenization_spaces``, ``chat_control_tokens``;
- ``special_tokens_map.json``: the named special tokens, read where ``tokenizer_config.json`` has no
  ``added_tokens_decoder`` (as transformers 5 does);
- ``chat_template.jinja``: the chat template, taking precedence over ``tokenizer_config.json``'s;
- the model's configs through the one resolver of a decoder's folder (``npurt.generate.folder``): the eos ids
  (``genai_config.json``'s, else ``generation_config.json``'s, one or a list, else ``config.json``'s) and the
  sampling defaults ``generation_config.json`` ships. A folder with a tokenizer and no model reads
  ``generation_config.json`` and ``genai_config.json`` itself.

Only the standard library here: the tokenizer and the template engine are imported where they are used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..generate.folder import read_configs, resolve
from .errors import NoTokenizerError

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# transformers' named special tokens (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES), in its order
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class TextFiles:
    """The text facts of one model folder."""

    folder: Path
    tokenizer_json: Path
    config: dict[str, Any]  # tokenizer_config.json (empty where there is none)
    special_tokens: dict[str, Any]  # named special token -> its string or AddedToken-like dict (in config order)
    extra_special_tokens: list[Any]
    added_tokens_decoder: dict[int, dict[str, Any]]
    chat_templates: dict[str, str]  # name ("default" for the one template) -> its source
    chat_template_source: str | None  # where the templates were read from (for errors)
    model_eos_token_ids: tuple[int, ...] = ()  # the model's configs' eos ids
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # generation_config.json's


def model_folder(model_dir_or_file: str | os.PathLike[str]) -> Path:
    """The folder of a model: the path itself where it is a folder, else the folder the model file is in."""
    path = Path(model_dir_or_file)
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    raise FileNotFoundError(f"no model folder or file at {path}")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ValueError naming the file where it is not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: a JSON object was expected, found {type(value).__name__}")
    return value


def _optional(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    return read_json(path) if path.is_file() else {}


def token_content(value: Any) -> str | None:
    """The text of a special token as the configs write it: a string, or an AddedToken dict ({"content": ...})."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def read(model_dir_or_file: str | os.PathLike[str]) -> TextFiles:
    """The text facts of the folder; NoTokenizerError where it has no tokenizer.json, ValueError for a file that
    cannot be read."""
    try:
        model = resolve(model_dir_or_file)  # ValueError for a config that says something of the wrong kind
        folder, eos, sampling = model.folder, model.eos_token_ids, model.sampling_defaults
    except FileNotFoundError:  # a tokenizer's folder without a model: its configs, read by the same rules
        configs = read_configs(model_folder(model_dir_or_file))
        folder, eos, sampling = configs.folder, configs.eos_token_ids, configs.sampling_defaults
    tokenizer_json = folder / TOKENIZER_JSON
    if not tokenizer_json.is_file():
        raise NoTokenizerError(f"{folder} has no {TOKENIZER_JSON}: text in and out needs the model's tokenizer "
                               "(a Hugging Face model folder ships it); token ids work without one")
    config = _optional(folder, TOKENIZER_CONFIG)
    # transformers 5: add_bos_token / add_eos_token are dropped where tokenizer.json exists (its post-processor rules)
    config = {k: v for k, v in config.items() if k not in ("add_bos_token", "add_eos_token")}
    merged = dict(config)
    if "added_tokens_decoder" not in config:  # the legacy file, read only then (as transformers 5 does)
        for key, value in _optional(folder, SPECIAL_TOKENS_MAP).items():
            if key == "additional_special_tokens" or key == "extra_special_tokens":
                if isinstance(value, list):
                    extra = list(merged.get("extra_special_tokens") or merged.get("additional_special_tokens") or [])
                    merged["extra_special_tokens"] = extra + [t for t in value if t not in extra]
                continue
            merged[key] = value
    specials: dict[str, Any] = {}
    for key, value in merged.items():
        # the named ones, then a model's own (e.g. "image_token"): transformers adds those to its special tokens
        if (key in SPECIAL_TOKEN_NAMES or key.endswith("_token")) and token_content(value) is not None:
            specials[key] = value
    ordered = {k: specials[k] for k in SPECIAL_TOKEN_NAMES if k in specials}
    ordered.update({k: v for k, v in specials.items() if k not in ordered})
    extra = merged.get("extra_special_tokens", merged.get("additional_special_tokens")) or []
    if isinstance(extra, dict):  # a model's named extras
        ordered.update({k: v for k, v in extra.items() if token_content(v) is not None})
        extra = []
    added: dict[int, dict[str, Any]] = {}
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(token, dict) and token_content(token) is not None:
            try:
                added[int(index)] = token
            except ValueError:
                raise ValueError(f"{folder / TOKENIZER_CONFIG}: added_tokens_decoder key {index!r} is not an "
                                 "id") from None
    templates, source = _chat_templates(folder, config)
    return TextFiles(folder=folder, tokenizer_json=tokenizer_json, config=config, special_tokens=ordered,
                     extra_special_tokens=[t for t in extra if token_content(t) is not None],
                     added_tokens_decoder=added, chat_templates=templates, chat_template_source=source,
                     model_eos_token_ids=eos, sampling_defaults=sampling)


def _chat_templates(folder: Path, config: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """chat_template.jinja (first), else tokenizer_config.json's chat_template: a string, or a list of
    {"name": ..., "template": ...} (transformers' named templates: "default", "tool_use", ...)."""
    path = folder / CHAT_TEMPLATE_FILE
    if path.is_file():
        try:
            return {"default": path.read_text(encoding="utf-8")}, str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: cannot be read ({e})") from None
    value = config.get("chat_template")
    source = f"{folder / TOKENIZER_CONFIG} (chat_template)"
    if isinstance(value, str):
        return {"default": value}, source
    if isinstance(value, list):
        templates = {}
        for entry in value:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ValueError(f"{source}: each entry of a list of templates has a 'name' and a 'template'")
            templates[entry["name"]] = entry["template"]
        return templates, source
    if value is not None:
        raise ValueError(f"{source}: a string or a list of named templates, found {type(value).__name__}")
    return {}, None


def eos_token_ids(files: TextFiles, eos_token_id: int | None) -> tuple[int, ...]:
    """The ids that end a generation: the model's configs' (see the module), else the tokenizer's eos token."""
    if files.model_eos_token_ids:
        return files.model_eos_token_ids
    return (eos_token_id,) if eos_token_id is not None else ()
