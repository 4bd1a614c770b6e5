"""``npurt.Embedder(folder)``: a sentence-transformers folder (or optimum's export) on any backend, its ``encode``
giving what sentence-transformers' ``encode`` gives.

What sentence-transformers does around the model, done here: the prompt (named, default or given) put before each
text; the folder's tokenizer truncating at the maximum length sentence-transformers decides (``folder``), not at
tokenizer.json's own, and no padding but the batch's; the texts sorted by length and batched by a token budget
(``batching``), or on a device that compiles static shapes in pinned, verified [batch, sequence] buckets
(``buckets``); the token embeddings pooled and normalised (``pooling``); then ``truncate_dim`` (Matryoshka: not
renormalised), ``normalize=True`` (unit vectors after that) and the quantized precisions (``quantize``).

Thread-safe: one Embedder serves many threads (the runner is thread-safe; nothing here changes after load).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..factory import RunnerFactory
from ..runner import Runner
from ..text.tokenizer import Tokenizer
from ..types import RunnerType
from .batching import DEFAULT_BATCH_TOKENS, Batch, by_token_budget, check_budget
from .buckets import ON_WRONG, BucketCheck, Buckets, default_buckets
from .folder import EmbeddingFolder, read_folder
from .pooling import exclude_prompt, normalize, pool
from .quantize import PRECISIONS, quantize

EXTRA_COMPILED_SHAPES = 4  # room in the engine cache beyond the buckets


def _lowercases(tokenizer: Any) -> bool:
    import json

    normalizer = tokenizer.normalizer
    if normalizer is None:
        return False
    text = json.dumps(json.loads(normalizer.__getstate__()))
    return '"Lowercase"' in text or '"lowercase": true' in text


class Embedder:
    """An embedding model on a backend: ``encode(texts)`` -> float32 [n, dim], as sentence-transformers'.

    ``folder``: a sentence-transformers folder (``onnx/model.onnx`` beside ``modules.json``), optimum's export
    (``model.onnx`` with ``sentence_embedding``), or the ONNX file in one. ``backend``: a RunnerType or backend name
    ("VAIML", "ONNXRUNTIME", "OPENVINO", "QNN", "AUTO"); ``device`` and ``options`` as for
    ``RunnerFactory.create_runner``. ``batch_tokens``: the positions one batch holds at most (rows x its longest).
    ``buckets``: None (pinned shapes where the device compiles static shapes, ``buckets.default_buckets``; ragged
    batches elsewhere), False (never), or (batch, sequence) pairs to pin on any device. Each bucket of more than one
    row is verified at load; ``on_wrong_bucket``: "batch1" (run its batches one row at a time, with a BucketWarning)
    or "error" (NpuError). ``max_length``: truncate there instead of where the folder says. ``model_file``: the ONNX
    file inside the folder, where it is not ``onnx/model.onnx`` or ``model.onnx``.

    FileNotFoundError where there is no model; ValueError for a folder npurt cannot run or a bad argument (the
    message says which); NpuError where the engine cannot load the model."""

    def __init__(self, folder: str | os.PathLike[str], backend: RunnerType | str = "AUTO", device: str = "AUTO",
                 options: Mapping[str, Any] | None = None, batch_tokens: int | None = None,
                 buckets: Sequence[Sequence[int]] | bool | None = None, *, max_length: int | None = None,
                 model_file: str | None = None, on_wrong_bucket: str = "batch1") -> None:
        self._lock = threading.Lock()
        self._whole: Any = None  # the tokenizer without truncation, made when first asked for
        self.last_batches: list[Batch] = []  # the batches of the last encode (any thread's), in the order run
        if on_wrong_bucket not in ON_WRONG:
            raise ValueError(f"on_wrong_bucket: one of {', '.join(ON_WRONG)}, got {on_wrong_bucket!r}")
        self.folder: EmbeddingFolder = read_folder(Path(folder), model_file)
        self.batch_tokens = check_budget(DEFAULT_BATCH_TOKENS if batch_tokens is None else batch_tokens)
        self.max_length = self._checked_max_length(max_length)
        self.tokenizer = Tokenizer(self.folder.root)
        backend_tokenizer = self.tokenizer.backend_tokenizer
        if self.folder.do_lower_case and not _lowercases(backend_tokenizer):
            from tokenizers import normalizers

            current = backend_tokenizer.normalizer
            backend_tokenizer.normalizer = normalizers.Sequence(
                [normalizers.Lowercase(), *([current] if current is not None else [])])
        # sentence-transformers' truncation (tokenizer.json's own, often at 128, overridden); padding per batch here
        backend_tokenizer.no_padding()
        backend_tokenizer.enable_truncation(self.max_length)
        self._bracket = tuple(backend_tokenizer.encode("").ids)  # what the post-processor puts around a text
        self._special_ids = set(self.tokenizer.all_special_ids)
        vocab = self.folder.vocab_size or len(self.tokenizer)
        self._vocab_size = vocab
        self._pad_id = self.tokenizer.pad_token_id or 0

        opts = dict(options or {})
        if "device" in opts and device != "AUTO" and str(opts["device"]).upper() != device.upper():
            raise ValueError(f"device {device!r} and options['device'] {opts['device']!r} disagree: give one")
        opts.setdefault("device", device)
        if buckets is True or not (buckets is None or buckets is False or isinstance(buckets, Sequence)):
            raise ValueError(f"buckets: None (as the device needs), False, or (batch, sequence) pairs, got {buckets!r}")
        shapes = None if buckets is None or buckets is False else list(buckets)
        planned = shapes if shapes is not None else default_buckets(self.max_length) if buckets is None else None
        if planned is not None:
            opts.setdefault("max_compiled_shapes", max(16, 2 * len(planned) + EXTRA_COMPILED_SHAPES))
        self.runner: Runner = RunnerFactory.create_runner(backend, self.folder.model_file, opts)
        try:
            static = self.runner.device_info.shape_mode == "static"
            self._buckets: Buckets | None = None
            if shapes is not None or (buckets is None and static):
                self._buckets = Buckets(planned or (), self.max_length)
                self._buckets.verify_with(self._forward_checked, vocab, self._bracket, on_wrong_bucket,
                                          where=f"{self.name} on {self.runner.runner_type} "
                                                f"{self.runner.device_info.attached}")
        except BaseException:
            self.runner.close()
            raise

    def _checked_max_length(self, max_length: int | None) -> int:
        if max_length is None:
            return self.folder.max_length
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length: an integer of at least 2, got {max_length!r}")
        limit = self.folder.max_position_embeddings
        if limit is not None and max_length > limit:
            raise ValueError(f"max_length {max_length} is past the model's max_position_embeddings ({limit})")
        return max_length

    # ------------------------------------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        """The model's name: its folder's."""
        return self.folder.name

    @property
    def dimension(self) -> int:
        """An embedding's width (before ``truncate_dim``)."""
        width = self.folder.dimension
        if width is None:  # neither the graph nor config.json says: one run tells
            width = int(self._embed([list(self._bracket) or [self._pad_id]], None, self.batch_tokens)[0].shape[1])
        return width

    @property
    def vocab_size(self) -> int:
        """The ids the model takes: 0 .. vocab_size - 1 (config.json's, else the tokenizer's)."""
        return self._vocab_size

    @property
    def backend(self) -> str:
        return self.runner.runner_type

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The [batch, sequence] shapes batches run in ([]: ragged batches, padded to their longest)."""
        return list(self._buckets.shapes) if self._buckets is not None else []

    @property
    def bucket_checks(self) -> list[BucketCheck]:
        """How each bucket of more than one row did at load against its rows run alone."""
        return list(self._buckets.checks) if self._buckets is not None else []

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.folder.prompts)

    # ------------------------------------------------------------------------------------------------ text
    def _prompt(self, prompt_name: str | None, prompt: str | None) -> str | None:
        """sentence-transformers' ``_resolve_prompt``: ``prompt`` wins, else the named one, else the default."""
        if prompt is not None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompt: a str, got {type(prompt).__name__}")
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.folder.prompts:
                raise ValueError(f"prompt_name {prompt_name!r}: {self.name} has "
                                 + (f"the prompts {list(self.folder.prompts)}" if self.folder.prompts else "no prompts")
                                 + " (config_sentence_transformers.json)")
            return self.folder.prompts[prompt_name]
        if self.folder.default_prompt_name is not None:
            return self.folder.prompts[self.folder.default_prompt_name]
        return None

    @staticmethod
    def _texts(texts: str | Sequence[str]) -> tuple[list[str], bool]:
        if isinstance(texts, str):
            return [texts], True
        if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Sequence):
            raise TypeError(f"texts: a str or a sequence of str, got {type(texts).__name__}")
        out = list(texts)
        for i, text in enumerate(out):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}]: a str, got {type(text).__name__}")
        return out, False

    def _tokenize(self, texts: list[str], prompt: str | None, truncate: bool = True) -> list[list[int]]:
        if prompt:
            texts = [prompt + t for t in texts]
        tokenizer = self.tokenizer.backend_tokenizer if truncate else self._untruncated()
        return [list(e.ids) for e in tokenizer.encode_batch(texts)]

    def _untruncated(self) -> Any:
        """A copy of the tokenizer that does not truncate (the shared one's settings never change: threads)."""
        with self._lock:
            if self._whole is None:
                from tokenizers import Tokenizer as Backend

                self._whole = Backend.from_str(self.tokenizer.backend_tokenizer.to_str())
                self._whole.no_truncation()
            return self._whole

    def tokenize(self, texts: str | Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None,
                 truncate: bool = True) -> list[list[int]]:
        """The ids ``encode`` runs for each text (special tokens and the prompt included, truncated at
        ``max_length``): ``encode_ids(tokenize(texts))`` is ``encode(texts)`` (but for pooling that leaves the
        prompt out, which needs the prompt's length). ``truncate=False``: every token, to tell how long a text is
        (a server that refuses texts past ``max_length`` instead of truncating them)."""
        items, _ = self._texts(texts)
        return self._tokenize(items, self._prompt(prompt_name, prompt), truncate)

    def _prompt_length(self, prompt: str | None) -> int | None:
        """The prompt's tokens to leave out of the pooling (``include_prompt: false``): as sentence-transformers
        counts them, with the leading special tokens and without a trailing one."""
        if not prompt or self.folder.pooled_in_graph or self.folder.pooling.include_prompt:
            return None
        ids = self._tokenize([prompt], None)[0]
        return len(ids) - (1 if ids and ids[-1] in self._special_ids else 0)

    # ------------------------------------------------------------------------------------------------ encoding
    def encode(self, texts: str | Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None,
               normalize: bool | None = None, truncate_dim: int | None = None, precision: str = "float32",
               batch_tokens: int | None = None) -> np.ndarray:
        """The embeddings of ``texts``: [n, dim] (a single str: [dim]), float32 or ``precision``'s type.

        ``prompt_name`` (one of the folder's prompts) or ``prompt`` (text) goes before each text (default: the
        folder's default prompt). ``normalize``: None (as the folder: its Normalize module), True (unit vectors,
        after ``truncate_dim``), False (without the folder's Normalize module; ValueError for a graph that pools
        itself). ``truncate_dim``: keep the first dims (not renormalised unless ``normalize=True``). ``precision``:
        "float32", "int8", "uint8" (ranges from these embeddings), "binary", "ubinary" (dim / 8 bytes).
        ``batch_tokens``: this call's budget. TypeError / ValueError for bad arguments."""
        items, single = self._texts(texts)
        self._check_output(normalize, truncate_dim, precision)
        prompt_text = self._prompt(prompt_name, prompt)
        ids = self._tokenize(items, prompt_text)
        return self._finish(ids, self._prompt_length(prompt_text), normalize, truncate_dim, precision,
                            batch_tokens, single)

    def encode_ids(self, ids: Sequence[Sequence[int]], *, normalize: bool | None = None,
                   truncate_dim: int | None = None, precision: str = "float32", batch_tokens: int | None = None,
                   truncate: bool = False) -> np.ndarray:
        """The embeddings of token-id lists, each run as it is (special tokens included, as ``tokenize`` gives
        them): [n, dim]. Lists longer than ``max_length`` are a ValueError, or cut there with ``truncate``; ids
        outside 0 .. vocab_size - 1, empty lists and non-integers are a ValueError naming the list."""
        self._check_output(normalize, truncate_dim, precision)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise TypeError(f"ids: a sequence of token-id lists, got {type(ids).__name__}")
        rows: list[list[int]] = []
        for i, row in enumerate(ids):
            if isinstance(row, (str, bytes)) or not isinstance(row, (Sequence, np.ndarray)):
                raise TypeError(f"ids[{i}]: a sequence of token ids, got {type(row).__name__}")
            array = np.asarray(row)
            if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
                raise ValueError(f"ids[{i}]: a flat list of integer token ids")
            if array.size == 0:
                raise ValueError(f"ids[{i}]: empty (at least one token id)")
            if array.size > self.max_length:
                if not truncate:
                    raise ValueError(f"ids[{i}]: {array.size} tokens, past the model's maximum of {self.max_length} "
                                     "(truncate=True cuts there)")
                array = array[:self.max_length]
            low, high = int(array.min()), int(array.max())
            if low < 0 or high >= self._vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"ids[{i}]: token id {bad} is outside the vocabulary (0 .. {self._vocab_size - 1})")
            rows.append(array.astype(np.int64).tolist())
        return self._finish(rows, None, normalize, truncate_dim, precision, batch_tokens, False)

    def _check_output(self, normalize: bool | None, truncate_dim: int | None, precision: str) -> None:
        if normalize is not None and not isinstance(normalize, bool):
            raise TypeError(f"normalize: None, True or False, got {normalize!r}")
        if normalize is False and self.folder.pooled_in_graph:
            raise ValueError(f"normalize=False: {self.name}'s graph pools (and may normalise) itself; npurt cannot "
                             "leave that out")
        if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int)
                                         or not 1 <= truncate_dim):
            raise ValueError(f"truncate_dim: a positive integer, got {truncate_dim!r}")
        if truncate_dim is not None and self.folder.dimension is not None and truncate_dim > self.folder.dimension:
            raise ValueError(f"truncate_dim {truncate_dim} is past the embedding's {self.folder.dimension} dims")
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")

    def _finish(self, ids: list[list[int]], prompt_length: int | None, normalize_flag: bool | None,
                truncate_dim: int | None, precision: str, batch_tokens: int | None, single: bool) -> np.ndarray:
        budget = self.batch_tokens if batch_tokens is None else check_budget(batch_tokens)
        vectors, batches = self._embed(ids, prompt_length, budget, skip_normalize=normalize_flag is False)
        with self._lock:
            self.last_batches = batches
        if truncate_dim is not None:
            vectors = np.ascontiguousarray(vectors[:, :truncate_dim])
        if normalize_flag:
            vectors = normalize(vectors)
        if precision != "float32" and len(vectors):
            out = quantize(vectors, precision)
        elif precision in ("binary", "ubinary"):
            out = np.zeros((0, -(-vectors.shape[1] // 8)), np.int8 if precision == "binary" else np.uint8)
        else:
            out = vectors.astype({"int8": np.int8, "uint8": np.uint8}.get(precision, np.float32), copy=False)
        return out[0] if single else out

    def _embed(self, ids: list[list[int]], prompt_length: int | None, budget: int, skip_normalize: bool = False
               ) -> tuple[np.ndarray, list[Batch]]:
        lengths = [len(row) for row in ids]
        batches = (self._buckets.plan(lengths, budget) if self._buckets is not None
                   else by_token_budget(lengths, budget))
        out: np.ndarray | None = None
        for batch in batches:
            rows = batch.rows
            array = np.full(batch.shape, self._pad_id, np.int64)
            mask = np.zeros(batch.shape, np.int64)
            for r, index in enumerate(rows):
                array[r, :lengths[index]] = ids[index]
                mask[r, :lengths[index]] = 1
            if len(rows) < batch.shape[0]:  # a bucket's spare rows: copies of the last row, dropped below
                array[len(rows):] = array[len(rows) - 1]
                mask[len(rows):] = mask[len(rows) - 1]
            vectors = self._forward(array, mask, prompt_length, skip_normalize)[:len(rows)]
            if out is None:
                out = np.empty((len(ids), vectors.shape[1]), np.float32)
            out[list(rows)] = vectors
        if out is None:
            width = self.folder.dimension
            if width is None:
                raise ValueError("no texts, and the folder does not say the embedding's width")
            out = np.empty((0, width), np.float32)
        return out, batches

    def _forward_checked(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._forward(ids, mask, None, False)

    def _forward(self, ids: np.ndarray, mask: np.ndarray, prompt_length: int | None, skip_normalize: bool
                 ) -> np.ndarray:
        """One batch through the model and the modules after it: [batch, dim] float32."""
        feeds: dict[str, np.ndarray] = {}
        for name, dtype in zip(self.folder.inputs, self.folder.input_dtypes):
            if name == "input_ids":
                value = ids
            elif name == "attention_mask":
                value = mask
            elif name == "token_type_ids":
                value = np.zeros_like(ids)
            else:  # position_ids
                value = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape)
            feeds[name] = np.ascontiguousarray(value, dtype)
        output = self.runner.run(feeds)[self.folder.output]
        if self.folder.pooled_in_graph:
            return np.asarray(output, np.float32)
        pooling_mask = exclude_prompt(mask, prompt_length) if prompt_length else mask
        vectors = pool(output, pooling_mask, self.folder.pooling.modes)
        return normalize(vectors) if self.folder.normalize and not skip_normalize else vectors

    # ------------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the runner (the engines and their threads)."""
        self.runner.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> list[str]:
        """Lines saying what was read and how it runs (``npurt embed`` prints them)."""
        f = self.folder
        how = ("pooled and normalised in the graph (sentence_embedding)" if f.pooled_in_graph else
               f"{f.output} pooled ({'+'.join(f.pooling.modes)}"
               + ("" if f.pooling.include_prompt else ", prompt left out") + ")"
               + (", normalised" if f.normalize else ""))
        shapes = (", ".join(f"[{b}, {s}]" for b, s in self.buckets) if self._buckets is not None
                  else f"ragged, up to {self.batch_tokens} positions a batch")
        lines = [f"{f.form} folder {f.root} ({f.model_file.relative_to(f.root)}); inputs {', '.join(f.inputs)}",
                 f"embedding: {how}; {self.dimension} dims",
                 f"max length {self.max_length} ({f.max_length_source if self.max_length == f.max_length else 'given'})"
                 + (f"; prompts {', '.join(f.prompts)}" if f.prompts else ""),
                 f"batches: {shapes}"]
        if self._buckets is not None and self._buckets.refused:
            lines.append("run one row at a time (batch rows computed wrong): "
                         + ", ".join(f"[{b}, {s}]" for b, s in self._buckets.refused))
        return lines

