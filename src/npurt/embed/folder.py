"""What an embedding model's folder says, read as sentence-transformers reads it (no network, no torch).

Two forms are common:

- sentence-transformers' folder (its ONNX backend saves ``onnx/model.onnx`` beside ``modules.json``): a Transformer
  module (the ONNX graph, its token embeddings out), then ``Pooling`` (``1_Pooling/config.json``: ``pooling_mode``,
  or the older ``pooling_mode_*_tokens`` flags, and ``include_prompt``) and ``Normalize``; its
  ``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``, the graph output it reads) and
  ``config_sentence_transformers.json`` (named ``prompts`` and ``default_prompt_name``);
- optimum's feature-extraction export (``model.onnx``, no ``modules.json``): the pooling and normalisation inside
  the graph, output ``sentence_embedding``.

A plain transformers export (``last_hidden_state`` only, no ``modules.json``) is read as sentence-transformers reads
a transformers model: mean pooling, no normalisation.

The maximum length, as sentence-transformers decides it: ``sentence_bert_config.json``'s ``max_seq_length`` where it
has one; else ``tokenizer_config.json``'s ``model_max_length`` bounded by ``config.json``'s
``max_position_embeddings`` (the folders disagree: tokenizer.json's own truncation, often 128, is not it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..modelinfo import ModelFileError, inspect_model
from ..text.files import read_json

MODEL_FILES = ("onnx/model.onnx", "model.onnx")  # where each form keeps its graph, in the order looked at
TOKEN_OUTPUTS = ("token_embeddings", "last_hidden_state")
SENTENCE_OUTPUT = "sentence_embedding"
ID_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")  # what npurt knows how to feed
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# the older flags of 1_Pooling/config.json, in the order sentence-transformers concatenates them
LEGACY_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                        "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# the module types run here, by their class name (sentence-transformers' module paths moved across versions)
TRANSFORMER, POOLING, NORMALIZE = "Transformer", "Pooling", "Normalize"
VERY_LARGE = 10**30  # transformers' model_max_length where the tokenizer config gives none


@dataclass(frozen=True)
class Pooling:
    """``1_Pooling/config.json``: the modes, concatenated in this order, and whether prompt tokens are pooled."""

    modes: tuple[str, ...] = ("mean",)
    include_prompt: bool = True


@dataclass(frozen=True)
class EmbeddingFolder:
    """One embedding model's folder, as read: the graph, its inputs and which output holds what, the modules
    around it, the maximum length and why, the prompts."""

    root: Path
    model_file: Path
    form: str  # "sentence-transformers", "optimum" (pooled in the graph) or "transformers" (token outputs only)
    inputs: tuple[str, ...]  # the graph's inputs, in its order (each of ID_INPUTS)
    input_dtypes: tuple[str, ...]  # numpy's names ("int64")
    output: str  # the output read: token embeddings (pooled here) or the graph's sentence_embedding
    pooled_in_graph: bool  # output is the sentence embedding (no pooling here)
    pooling: Pooling  # applied to token embeddings (unused where pooled_in_graph)
    normalize: bool  # a Normalize module follows the pooling (where pooled_in_graph: the graph's own business)
    max_length: int
    max_length_source: str  # where max_length comes from, for messages and `npurt embed`
    max_position_embeddings: int | None
    hidden_size: int | None  # the token embeddings' width, where the graph or config.json says
    vocab_size: int | None  # config.json's (the embedding table's rows)
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def dimension(self) -> int | None:
        """The width of an embedding (before ``truncate_dim``), where the files say it."""
        if self.hidden_size is None:
            return None
        return self.hidden_size if self.pooled_in_graph else self.hidden_size * len(self.pooling.modes)


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or {} where the folder has no such file."""
    return read_json(path) if path.is_file() else {}


def _positive_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or int(value) != value:
        raise ValueError(f"{what}: a positive integer was expected, found {value!r}")
    return int(value)


def _last_dim(shape: tuple[int | None, ...] | None) -> int | None:
    return shape[-1] if shape else None


def _locate(path: Path, model_file: str | None) -> tuple[Path, Path]:
    """(the folder, the ONNX file) for a folder or a model file given."""
    if path.is_file():
        root = path.parent.parent if path.parent.name == "onnx" and (path.parent.parent / "modules.json").is_file() \
            else path.parent
        return root, path
    if not path.is_dir():
        raise FileNotFoundError(f"no embedding model folder or file at {path}")
    candidates = [model_file] if model_file is not None else list(MODEL_FILES)
    for name in candidates:
        if (path / name).is_file():
            return path, path / name
    found = sorted(str(p.relative_to(path)) for p in path.rglob("*.onnx"))
    raise FileNotFoundError(f"{path}: no {' or '.join(candidates)}" + (
        f" (it has {', '.join(found)}: pass model_file=)" if found else " (no ONNX file at all: export the model "
                                                                         "with sentence-transformers' ONNX backend "
                                                                         "or optimum first)"))


def _module_kind(entry: Any, where: Path) -> tuple[str, str]:
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValueError(f"{where}: each module needs a 'type', found {entry!r}")
    return entry["type"].rpartition(".")[2], str(entry.get("path", ""))


def _pooling(config: dict[str, Any], where: Path) -> Pooling:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in LEGACY_POOLING_FLAGS.items() if config.get(key)) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ValueError(f"{where}: pooling mode {bad[0] if bad else mode!r} is not one of {', '.join(POOLING_MODES)}")
    return Pooling(modes, bool(config.get("include_prompt", True)))


def read_folder(path: str | Path, model_file: str | None = None) -> EmbeddingFolder:
    """Read an embedding model's folder (or its ONNX file). FileNotFoundError where there is no model; ValueError
    naming the file where one is damaged or asks for what npurt does not run (a module other than Transformer,
    Pooling and Normalize; a graph input other than ids, mask, token types and positions)."""
    root, onnx_file = _locate(Path(path), model_file)
    try:
        declared = inspect_model(onnx_file)
    except ModelFileError as e:
        raise ValueError(str(e)) from None
    inputs = tuple(p.name for p in declared.inputs)
    unknown = [n for n in inputs if n not in ID_INPUTS]
    if unknown or "input_ids" not in inputs:
        raise ValueError(f"{onnx_file}: inputs {list(inputs)}; an embedding model's are input_ids and some of "
                         f"{', '.join(ID_INPUTS[1:])}" + (f" (npurt cannot feed {unknown})" if unknown else ""))
    outputs = {p.name: p for p in declared.outputs}
    model_config = _json(root / "config.json")
    st_config = _json(root / "sentence_bert_config.json")
    tokenizer_config = _json(root / "tokenizer_config.json")
    st_model_config = _json(root / "config_sentence_transformers.json")
    positions = model_config.get("max_position_embeddings")
    max_positions = None if positions == -1 else _positive_int(  # (-1: no limit, as XLNet writes it)
        positions, f"{root / 'config.json'}: max_position_embeddings")

    modules_file = root / "modules.json"
    pooling, normalize, form = Pooling(), False, "transformers"
    if modules_file.is_file():
        try:
            modules = json.loads(modules_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{modules_file}: not a readable JSON file ({e})") from None
        if not isinstance(modules, list) or not modules:
            raise ValueError(f"{modules_file}: a list of modules was expected")
        kinds = [_module_kind(m, modules_file) for m in modules]
        if kinds[0][0] != TRANSFORMER:
            raise ValueError(f"{modules_file}: the first module is {kinds[0][0]}, not a Transformer")
        has_pooling = False
        for kind, sub in kinds[1:]:
            if kind == POOLING and not has_pooling and not normalize:
                pooling = _pooling(_json(root / sub / "config.json"), root / sub / "config.json")
                has_pooling = True
            elif kind == NORMALIZE and not normalize:
                normalize = True
            else:
                raise ValueError(f"{modules_file}: module {kind} ({sub or 'no folder'}) is not run by npurt.Embedder, "
                                 "which runs Transformer, then Pooling, then Normalize")
        form = "sentence-transformers"

    hinted = st_config.get("method_output_name") if isinstance(st_config.get("method_output_name"), str) else None
    token_output = next((n for n in ((hinted,) if hinted else ()) + TOKEN_OUTPUTS if n in outputs), None)
    if token_output is None:
        token_output = next((n for n, p in outputs.items() if p.shape is not None and len(p.shape) == 3), None)
    pooled_in_graph = form != "sentence-transformers" and SENTENCE_OUTPUT in outputs
    if pooled_in_graph:
        form, output = "optimum", SENTENCE_OUTPUT
    elif token_output is not None:
        output = token_output
    else:
        raise ValueError(f"{onnx_file}: outputs {list(outputs)}; none holds token embeddings ([batch, sequence, "
                         f"hidden]: {' or '.join(TOKEN_OUTPUTS)}) or {SENTENCE_OUTPUT}")
    hidden = _last_dim(outputs[output].shape)
    if hidden is None and token_output is not None:  # (optimum names the pooled width symbolically)
        hidden = _last_dim(outputs[token_output].shape)
    if hidden is None:
        hidden = _positive_int(model_config.get("hidden_size"), f"{root / 'config.json'}: hidden_size")

    # the maximum length, in sentence-transformers' order
    st_max = _positive_int(st_config.get("max_seq_length"), f"{root / 'sentence_bert_config.json'}: max_seq_length")
    if st_max is not None:
        max_length, source = st_max, "sentence_bert_config.json max_seq_length"
    else:
        raw = tokenizer_config.get("model_max_length")
        tok_max = VERY_LARGE if raw is None or (isinstance(raw, (int, float)) and raw >= VERY_LARGE) else \
            _positive_int(raw, f"{root / 'tokenizer_config.json'}: model_max_length")
        assert tok_max is not None
        if max_positions is not None and max_positions < tok_max:
            max_length, source = max_positions, "config.json max_position_embeddings"
            if tok_max < VERY_LARGE:
                source += f" (below tokenizer_config.json model_max_length {tok_max})"
        elif tok_max < VERY_LARGE:
            max_length, source = tok_max, "tokenizer_config.json model_max_length"
        else:
            raise ValueError(f"{root}: no maximum length (no max_seq_length in sentence_bert_config.json, no "
                             "model_max_length in tokenizer_config.json, no max_position_embeddings in config.json): "
                             "pass max_length=")
    prompts = st_model_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"{root / 'config_sentence_transformers.json'}: prompts must map names to strings")
    default_prompt = st_model_config.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise ValueError(f"{root / 'config_sentence_transformers.json'}: default_prompt_name {default_prompt!r} is "
                         f"not among its prompts {list(prompts)}")
    return EmbeddingFolder(
        root=root, model_file=onnx_file, form=form, inputs=inputs,
        input_dtypes=tuple(p.dtype for p in declared.inputs), output=output, pooled_in_graph=pooled_in_graph,
        pooling=pooling, normalize=normalize, max_length=max_length, max_length_source=source,
        max_position_embeddings=max_positions, hidden_size=hidden,
        vocab_size=_positive_int(model_config.get("vocab_size"), f"{root / 'config.json'}: vocab_size"),
        do_lower_case=bool(st_config.get("do_lower_case", False)), prompts=dict(prompts),
        default_prompt_name=default_prompt)
