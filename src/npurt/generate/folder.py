"""A decoder's model folder, resolved in one place for the runner (option ``decoder``), the text layer and the
server (issue 43 part 5): a folder or a model file in, the ONNX file and what the configs beside it say out.

- the model file: the path given where it is a file; in a folder, genai_config.json's ``model.decoder.filename``,
  else ``model.onnx``, else ``decoder_model_merged.onnx`` (optimum's merged decoder), else its only ``*.onnx``;
- ``genai_config.json`` (ONNX Runtime GenAI's), else ``config.json`` and ``generation_config.json`` (Hugging Face's,
  as optimum and transformers.js exports ship them): the eos ids (one or a list: Llama 3 and Qwen have several),
  bos and pad, the context length (``context_length``, else ``max_position_embeddings``), the sampling defaults.

A value of the wrong kind (an eos that is neither an int nor a list of ints, a context length that is not a positive
int) is a ValueError naming the file and the key: read as "none", the loop would never stop at eos. Only the
standard library: no engine is imported here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

GENAI_CONFIG = "genai_config.json"
HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
MODEL_FILES = ("model.onnx", "decoder_model_merged.onnx")  # in a folder without genai_config.json, in this order
SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")


@dataclass(frozen=True)
class FolderConfigs:
    """What the configs of a folder say (``read_configs``), with or without a model in it (a tokenizer's folder)."""

    folder: Path
    genai_config: dict[str, Any] = field(default_factory=dict)  # genai_config.json (empty where there is none)
    config: dict[str, Any] = field(default_factory=dict)  # config.json
    generation_config: dict[str, Any] = field(default_factory=dict)  # generation_config.json
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    context_length: int | None = None
    sources: tuple[str, ...] = ()  # the config files read, for messages

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """The sampling settings generation_config.json ships (do_sample, temperature, top_k, top_p), those there."""
        return {k: self.generation_config[k] for k in SAMPLING_KEYS if k in self.generation_config}

    @property
    def cache_dims(self) -> dict[str, tuple[int, str]]:
        """The KV cache's heads and head size as the configs give them ("kv_heads" / "head_dim" -> (value, the key
        read)), for an export whose graph names those dims (the model builder's ``kv_cache_dim``): genai_config.json's
        ``model.decoder`` first, then config.json (``head_dim``, else ``hidden_size / num_attention_heads``)."""
        decoder = self.genai_config.get("model", {}).get("decoder") or {}
        found: dict[str, tuple[int, str]] = {}
        for what, keys in (("kv_heads", [(GENAI_CONFIG, decoder, "num_key_value_heads"),
                                         (HF_CONFIG, self.config, "num_key_value_heads")]),
                           ("head_dim", [(GENAI_CONFIG, decoder, "head_size"), (HF_CONFIG, self.config, "head_dim")])):
            for source, values, key in keys:
                if values.get(key) is not None:
                    found[what] = (_positive(values[key], f"{source}: {key}"), f"{source}'s {key}")
                    break
        heads, hidden = self.config.get("num_attention_heads"), self.config.get("hidden_size")
        if "head_dim" not in found and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
            found["head_dim"] = (hidden // heads, f"{HF_CONFIG}'s hidden_size / num_attention_heads")
        return found

    def file(self, name: str) -> Path | None:
        """``name`` in the folder, where it is there (tokenizer.json and the like)."""
        path = self.folder / name
        return path if path.is_file() else None


@dataclass(frozen=True, kw_only=True)
class ModelFolder(FolderConfigs):
    """What a decoder's folder holds (``resolve``): its configs and its model file."""

    model: Path  # the ONNX file


def resolve(model_dir_or_file: str | os.PathLike[str]) -> ModelFolder:
    """The folder's model file and config facts (see the module). FileNotFoundError where there is no model;
    ValueError for a config that cannot be read or says something of the wrong kind."""
    path = Path(model_dir_or_file)
    if not path.exists():
        raise FileNotFoundError(f"no model folder or file at {path}")
    configs = read_configs(path if path.is_dir() else path.parent)
    model = path if path.is_file() else _model_file(configs.folder, configs.genai_config.get("model", {}))
    return ModelFolder(model=model, **{f.name: getattr(configs, f.name) for f in fields(FolderConfigs)})


def read_configs(folder: Path) -> FolderConfigs:
    """What the configs in ``folder`` say, first found wins: genai_config.json's model entry, generation_config.json,
    config.json. ValueError for a config that cannot be read or says something of the wrong kind."""
    genai = _json(folder / GENAI_CONFIG)
    hf, generation = _json(folder / HF_CONFIG), _json(folder / GENERATION_CONFIG)
    genai_model = genai.get("model", {})
    if not isinstance(genai_model, dict):
        raise ValueError(f"{folder / GENAI_CONFIG}: its 'model' entry is not an object")
    layers = [(GENAI_CONFIG, genai_model), (GENERATION_CONFIG, generation), (HF_CONFIG, hf)]
    eos = _first(layers, "eos_token_id", _ids)
    context = _first([(GENAI_CONFIG, genai_model), (HF_CONFIG, hf)], "context_length", _positive)
    if context is None:
        context = _first([(HF_CONFIG, hf)], "max_position_embeddings", _positive)
    return FolderConfigs(folder=folder, genai_config=genai, config=hf, generation_config=generation,
                         eos_token_ids=eos or (), bos_token_id=_first(layers, "bos_token_id", _id),
                         pad_token_id=_first(layers, "pad_token_id", _id), context_length=context,
                         sources=tuple(name for name, d in ((GENAI_CONFIG, genai), (GENERATION_CONFIG, generation),
                                                            (HF_CONFIG, hf)) if d))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def _model_file(folder: Path, genai_model: dict[str, Any]) -> Path:
    named = (genai_model.get("decoder") or {}).get("filename")
    if isinstance(named, str):
        path = folder / named
        if not path.is_file():
            raise FileNotFoundError(f"{folder / GENAI_CONFIG} names the model {named!r}, which is not in {folder}")
        return path
    for name in MODEL_FILES:
        if (folder / name).is_file():
            return folder / name
    found = sorted(p.name for p in folder.glob("*.onnx"))
    if len(found) == 1:
        return folder / found[0]
    raise FileNotFoundError(f"{folder}: no decoder model to take (no genai_config.json, no {' or '.join(MODEL_FILES)}"
                            f"; ONNX files: {', '.join(found) or 'none'}): name the model file")


def _first(layers: list[tuple[str, dict[str, Any]]], key: str, read: Any) -> Any:
    for source, values in layers:
        if values.get(key) is not None:
            return read(values[key], f"{source}: {key}")
    return None


def _id(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a token id (an integer >= 0), found {value!r}")
    return value


def _ids(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(_id(v, where) for v in value)
    return (_id(value, where),)


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} must be a positive integer, found {value!r}")
    return value
