"""A served language model: a decoder runner (option ``decoder``), its folder's tokenizer where it has one, and the
``Scheduler`` that runs its sequences. ``GenerationSettings`` (``settings``) are the flags every served decoder takes.

Memory per sequence (a cache held by a pooled Generator; ``max_sequences`` of them at most, whatever the number of
clients): ``2 x layers x kv_heads x max_length x head_dim x 4`` bytes of keys and values (float32), one row of
logits (``vocab x 4``), the ids of its runs, and on OpenVINO an infer request of its own. With batched steps the
caches are rows of pooled buffers, allocated a pool at a time (``pools.BatchPool``: its rows may exceed
``max_sequences`` up to the next batch size), and each batch size's run holds ``size x vocab x 4`` bytes of logits.

Batched steps (``batch_sizes``), by default where the measurements (docs/generate.md, docs/serve.md) say they pay:
on the ONNX Runtime backends (ONNXRUNTIME, VAIML, QNN), fp32 / fp16 decoders up to 8 rows a run; int4 decoders whose
MatMulNBits run int8 activations (accuracy level 4, as the model builder writes them for the CPU) in pools of 2 rows
(ONNX Runtime's CPU MatMulNBits costs about as much per row beyond two); a Concat-cache export (optimum's form) only
up to ``CONCAT_BATCH_MAX_LENGTH`` cache rows (its batch form attends over every row of the cache); OpenVINO never
(its cache lives per infer request). Under ``--backend auto`` the decision is the backend's that loads the decoder
(``load_runner``: each backend AUTO tries is given its own batch sizes), not the first AUTO tries.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ... import onnx_graph
from ...factory import RunnerFactory, auto_order, create_auto
from ...generate.folder import ModelFolder, resolve
from ...runner import Runner
from ...text.tokenizer import Tokenizer
from .pools import BatchPool
from .scheduler import Scheduler, SequenceObserver
from .settings import DEFAULT_MAX_LENGTH, GenerationSettings

log = logging.getLogger("npurt.serve")

MODEL_FILE = "model.onnx"
BATCHING_BACKENDS = ("ONNXRUNTIME", "VAIML", "QNN")  # a decoder's cache pooled and bound in place
DEFAULT_BATCH = (1, 2, 4, 8)  # fp32 / fp16: 3-6x one sequence's ids/s at 8 rows on the CPU (benchmarks/batch_steps)
# int4 at accuracy level 4 (1.2-1.8x at 2 rows, no more at 4, less at 8) is not batched by default: MatMulNBits runs
# one row and several by other kernels, so a step batched with another sequence's row gives other logits (up to
# 0.43 on SmolLM2's builder int4, measured with plain ONNX Runtime) and a request's answer would hang on the load
INT8_ACTIVATIONS_BATCH = (1, 2)  # what --batch 1,2 gives it
# a Concat cache's batch form attends over all max_length rows in every row (the plain form over the rows written):
# on the benchmark decoder a step of 8 rows gave 2.1x one row's ids/s at 256 rows, 1.4x at 512, 0.8x at 1024
CONCAT_BATCH_MAX_LENGTH = 512


def model_folder(path: Path) -> ModelFolder:
    """The decoder's folder resolved (its model file, context length, eos ids, sampling defaults): ValueError for a
    folder without a model or with a config that cannot be read."""
    try:
        return resolve(path)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None


def graph_facts(model: Path) -> tuple[bool, bool]:
    """Whether the decoder's MatMulNBits run int8 activations (accuracy_level 4), and whether its attention is
    GroupQueryAttention (the model builder's form; else a Concat cache, optimum's); (False, False) where the graph
    cannot be read (the runner then says why)."""
    try:
        graph = onnx_graph.read_skeleton(model).model.graph
    except (OSError, ValueError):
        return False, False
    int8 = any(n.op_type == "MatMulNBits" and any(a.name == "accuracy_level" and a.i == 4 for a in n.attribute)
               for n in graph.node)
    return int8, any(n.op_type == "GroupQueryAttention" for n in graph.node)


def max_length_of(folder: ModelFolder, settings: GenerationSettings) -> int:
    """Rows of each cache: ``--max-length``, else the model's context length, at most DEFAULT_MAX_LENGTH."""
    if settings.max_length is not None:
        return settings.max_length
    context = folder.context_length
    return min(context, DEFAULT_MAX_LENGTH) if context is not None else DEFAULT_MAX_LENGTH


def batch_sizes(folder: ModelFolder, settings: GenerationSettings, backend: str) -> tuple[tuple[int, ...], str]:
    """The runner's batch sizes for steps batched across sequences (() : one sequence a run) and why. Sizes beyond
    the smallest that holds ``max_sequences`` are dropped (never used). ValueError for ``--batch`` on OpenVINO."""
    max_length = max_length_of(folder, settings)
    name = backend.upper()
    if name == "AUTO":  # a guess, the backend AUTO tries first: load_runner decides by each backend it tries
        order = auto_order()
        name = order[0][0] if order else name
    if settings.batch is not None:
        sizes, why = tuple(sorted(set(settings.batch))), "--batch"
        if max(sizes, default=1) > 1 and name == "OPENVINO":
            raise ValueError("--batch: OpenVINO keeps a decoder's cache per infer request, its steps are not batched "
                             "across sequences; leave --batch out (or give --batch 1)")
    elif name not in BATCHING_BACKENDS:
        return (), f"{name} does not batch steps across sequences (its cache lives per infer request)"
    else:
        int8, group_query = graph_facts(folder.model)
        if not group_query and max_length > CONCAT_BATCH_MAX_LENGTH:
            return (), (f"a Concat cache of {max_length} rows: its batch form attends over all of them in every row "
                        f"(batched by default up to --max-length {CONCAT_BATCH_MAX_LENGTH}; --batch to force)")
        if int8:
            return (), ("int4 with int8 activations: a step batched with other rows gives other logits than alone "
                        f"(--batch {','.join(map(str, INT8_ACTIVATIONS_BATCH))} batches it anyway)")
        else:
            sizes, why = DEFAULT_BATCH, f"--batch auto on {name}"
    cap = next((b for b in sizes if b >= settings.max_sequences), None)
    sizes = tuple(b for b in sizes if cap is None or b <= cap)
    if max(sizes, default=1) <= 1:
        return (), "--max-sequences 1" if settings.max_sequences == 1 else "--batch 1"
    return sizes, why


def runner_options(folder: ModelFolder, settings: GenerationSettings, base: dict[str, Any], backend: str
                   ) -> dict[str, Any]:
    """The decoder runner's options: ``base`` (device, threads, cache_dir ...) and option ``decoder`` (with
    ``batch`` where steps are batched: ``batch_sizes``)."""
    max_length = max_length_of(folder, settings)
    decoder: dict[str, Any] = {"max_length": max_length, "prefill_chunk": min(settings.prefill_chunk, max_length)}
    sizes = batch_sizes(folder, settings, backend)[0]
    if sizes:
        decoder["batch"] = list(sizes)
    options = {**base, "decoder": decoder}
    # a server runs long: its decoder's memory onto huge pages at any size (npurt.huge_pages; the collapse, up to
    # ~2 s beside the first steps on a 540 MB model, is paid once)
    options.setdefault("huge_pages", True)
    if backend.upper() == "OPENVINO":
        options.setdefault("inference_precision", "f32")  # a decoder's tokens change at near-ties in bf16
    return options


def load_runner(folder: ModelFolder, settings: GenerationSettings, base: dict[str, Any], backend: str
                ) -> tuple[Runner, str]:
    """The decoder's runner, and why its steps are batched or not (``batch_sizes``), decided by the backend that
    loads it. Under AUTO each backend is tried in AUTO's order (``factory.auto_order``) with the options that
    backend takes (``runner_options``: batch sizes on the ONNX Runtime backends, none on OpenVINO), by
    ``factory.create_auto``: a decoder that OpenVINO cannot load (e.g. on its NPU) runs batched on the ONNX Runtime
    backend that takes it. ValueError for a bad setting; AutoLoadError where no backend loads it."""
    name = backend.upper()
    if name != "AUTO":
        options = runner_options(folder, settings, base, name)
        return RunnerFactory.create_runner(name, folder.model, options), batch_sizes(folder, settings, name)[1]
    runner, choice = create_auto(folder.model, options_for=lambda tried: runner_options(folder, settings, base, tried))
    log.info("decoder %s: --backend auto: %s%s", folder.model, choice.explain(),
             "".join(f"; {n} could not load it: {why}" for n, why in choice.failures))
    return runner, batch_sizes(folder, settings, choice.backend)[1]


def load_tokenizer(path: Path) -> Tokenizer | None:
    """The folder's tokenizer (``npurt.Tokenizer``), None where the folder has none (ids only)."""
    folder = path if path.is_dir() else path.parent
    if not (folder / "tokenizer.json").is_file():
        return None
    return Tokenizer(folder)


class LanguageModel:
    """One ``--generate NAME=MODEL_DIR``: its runner, tokenizer and scheduler."""

    def __init__(self, name: str, path: Path, runner: Runner, settings: GenerationSettings,
                 observer: SequenceObserver | None = None, folder: ModelFolder | None = None,
                 batching: str = "") -> None:
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
        pool = self.scheduler.pool
        steps = (f"steps batched up to {max(facts.batch)} rows a run ({pool.rows} cache rows in pools of "
                 f"{pool.rows_per_pool})" if isinstance(pool, BatchPool) else "one sequence's step a run")
        if batching:  # why (batch_sizes)
            steps += f" ({batching})"
        log.info("language model %s (%s): context %d, prefill chunk %d, %s; %d sequences at once (%.3g MiB of cache "
                 "each), %d may wait; %s; %s", name, path, facts.max_length, facts.prefill_chunk,
                 runner.device_info.summary(), settings.max_sequences, self.cache_bytes / 2**20, settings.max_queue,
                 steps, "text and ids" if self.tokenizer is not None else "ids only (no tokenizer.json)")

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


__all__ = ["LanguageModel", "batch_sizes", "load_runner", "load_tokenizer", "model_folder", "runner_options"]
