"""A served language model: a decoder runner (option ``decoder``), its folder's tokenizer where it has one, and the
``Scheduler`` that runs its sequences. ``GenerationSettings`` (``settings``) are the flags every served decoder takes.

Memory per sequence (a cache held by a pooled Generator; ``max_sequences`` of them at most, whatever the number of
clients): ``2 x layers x kv_heads x max_length x head_dim x 4`` bytes of keys and values (float32), one row of
logits (``vocab x 4``), the ids of its runs, and on OpenVINO an infer request of its own.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ...generate.folder import ModelFolder, resolve
from ...runner import Runner
from ...text.tokenizer import Tokenizer
from .scheduler import Scheduler, SequenceObserver
from .settings import DEFAULT_MAX_LENGTH, GenerationSettings

log = logging.getLogger("npurt.serve")

MODEL_FILE = "model.onnx"


def model_folder(path: Path) -> ModelFolder:
    """The decoder's folder resolved (its model file, context length, eos ids, sampling defaults): ValueError for a
    folder without a model or with a config that cannot be read."""
    try:
        return resolve(path)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None


def runner_options(folder: ModelFolder, settings: GenerationSettings, base: dict[str, Any], backend: str
                   ) -> dict[str, Any]:
    """The decoder runner's options: ``base`` (device, threads, cache_dir ...) and option ``decoder``."""
    context = folder.context_length
    max_length = settings.max_length
    if max_length is None:
        max_length = min(context, DEFAULT_MAX_LENGTH) if context is not None else DEFAULT_MAX_LENGTH
    options = {**base, "decoder": {"max_length": max_length, "prefill_chunk": min(settings.prefill_chunk,
                                                                                    max_length)}}
    if backend.upper() == "OPENVINO":
        options.setdefault("inference_precision", "f32")  # a decoder's tokens change at near-ties in bf16
    return options


def load_tokenizer(path: Path) -> Tokenizer | None:
    """The folder's tokenizer (``npurt.Tokenizer``), None where the folder has none (ids only)."""
    folder = path if path.is_dir() else path.parent
    if not (folder / "tokenizer.json").is_file():
        return None
    return Tokenizer(folder)


class LanguageModel:
    """One ``--generate NAME=MODEL_DIR``: its runner, tokenizer and scheduler."""

    def __init__(self, name: str, path: Path, runner: Runner, settings: GenerationSettings,
                 observer: SequenceObserver | None = None, folder: ModelFolder | None = None) -> None:
        facts = runner.decoder
        if facts is None:
            raise ValueError(f"--generate {name}: the runner was made without option 'decoder'")
        self.name, self.path, self.runner, self.settings, self.facts = name, path, runner, settings, facts
        self.created = int(time.time())
        self.tokenizer = load_tokenizer(path)
        # generation_config.json's sampling settings: what a request that leaves them out gets (as vLLM does)
        self.sampling_defaults = dict((folder or model_folder(path)).sampling_defaults)
        self.eos = frozenset(facts.eos_token_ids)
        self.scheduler = Scheduler(name, runner, settings.max_sequences, settings.max_queue, settings.prefix_reuse,
                                   observer)
        log.info("language model %s (%s): context %d, prefill chunk %d, %s; %d sequences at once (%.3g MiB of cache "
                 "each), %d may wait; %s", name, path, facts.max_length, facts.prefill_chunk,
                 runner.device_info.summary(), settings.max_sequences, self.cache_bytes / 2**20, settings.max_queue,
                 "text and ids" if self.tokenizer is not None else "ids only (no tokenizer.json)")

    @property
    def max_length(self) -> int:
        return self.facts.max_length

    @property
    def cache_bytes(self) -> int:
        """One sequence's keys and values: 2 x layers x kv_heads x max_length x head_dim x 4 bytes (float32)."""
        f = self.facts
        return 2 * f.layers * f.kv_heads * f.max_length * f.head_dim * 4

    def close(self, why: str) -> None:
        self.scheduler.close(why)
        self.runner.close()


__all__ = ["LanguageModel", "load_tokenizer", "model_folder", "runner_options"]
