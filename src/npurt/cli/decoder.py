"""What `npurt generate` and `npurt chat` share: a decoder's model folder (or file) and its tokenizer, the runner made
with option ``decoder``, and the flags that apply to a decoder (no --shape, --frame, --hw-view: those are derived).
The runner keeps its derived form and its verdict in npurt's cache directory unless told otherwise (``--cache-dir``,
``--no-cache``): a second load reads them instead of deriving and checking again."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .common import (
    EXIT_USAGE,
    CliError,
    Loaded,
    add_cache_options,
    add_model_options,
    cache_dir_of,
    create_runner,
    engine_options,
    resolve_backend,
)

if TYPE_CHECKING:
    from ..generate.folder import ModelFolder
    from ..text.tokenizer import Tokenizer

DEFAULT_MAX_LENGTH = 256


def add_decoder_options(p: argparse.ArgumentParser, default_chunk: int = 16) -> None:
    p.add_argument("model", metavar="MODEL_DIR",
                   help="the decoder's folder (model.onnx, genai_config.json, and for text tokenizer.json) or its "
                        "model.onnx")
    add_model_options(p, "openvino, vaiml, qnn, onnxruntime or auto", "auto", decoder=True)
    p.add_argument("--max-length", type=int, metavar="L",
                   help=f"rows of the KV cache (default: what the prompt and the new tokens need, at least "
                        f"{DEFAULT_MAX_LENGTH}, at most the model's context length)")
    p.add_argument("--prefill-chunk", type=int, default=default_chunk, metavar="C",
                   help=f"prompt tokens per run where the device pins shapes (default {default_chunk})")
    p.add_argument("--threads", type=int, metavar="N", help="engine threads per run (option num_threads; default: "
                                                            "the engine's choice)")
    add_cache_options(p, "the decoder's derived form, the verdict of its check against the export and the "
                         "compiled model")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"do_sample": args.sample, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
            "seed": args.seed}


def model_file(model: str) -> ModelFolder:
    """The decoder's folder resolved (``npurt.generate.folder``): its ONNX file (MODEL itself, or in the folder
    genai_config.json's model file, else model.onnx, ...) and what its configs say."""
    from ..generate.folder import resolve

    try:
        return resolve(model)
    except (FileNotFoundError, ValueError) as e:
        raise CliError(str(e)) from None


def tokenizer(model: str, required: str | None) -> Tokenizer | None:
    """The folder's tokenizer; None where it has none, unless text was asked for (``required``: the flag that
    asked, named in the error)."""
    from ..text.errors import NoTokenizerError
    from ..text.tokenizer import Tokenizer

    try:
        return Tokenizer(model)
    except NoTokenizerError as e:
        if required is not None:
            raise CliError(f"{required} needs the model's tokenizer: {e}", EXIT_USAGE) from None
        return None
    except ValueError as e:
        raise CliError(str(e)) from None


def load(args: argparse.Namespace, model: ModelFolder, needed: int) -> Loaded:
    """The runner with option ``decoder``: ``--max-length`` rows, else ``needed`` (at least DEFAULT_MAX_LENGTH, at
    most the model's context length)."""
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads {args.threads}: must be 1 or more", EXIT_USAGE)
    max_length = args.max_length or max(DEFAULT_MAX_LENGTH, needed)
    context = model.context_length
    if args.max_length is None and context is not None:
        max_length = min(max_length, context)
    options: dict[str, Any] = {"device": args.device, "fallback": args.fallback,
                               "decoder": {"max_length": max_length,
                                           "prefill_chunk": min(args.prefill_chunk, max_length)}}
    if args.backend.upper() == "OPENVINO":
        options["inference_precision"] = "f32"  # a decoder's tokens change at near-ties in bf16
    if engine := engine_options(args):
        options["engine_options"] = engine
    if args.threads is not None:
        options["num_threads"] = args.threads
    cache, note = cache_dir_of(args)
    if note:  # (on stderr for both commands: chat prints no notes, and --json's stdout stays JSON)
        print(f"npurt: {note}", file=sys.stderr)
    if cache is not None:
        options["cache_dir"] = str(cache)
    loaded = create_runner(resolve_backend(args.backend), model.model, options)
    loaded.cache_dir = cache
    return loaded


@dataclass
class Speed:
    """A turn's speed as the commands print it."""

    new_tokens: int
    first_token_s: float
    tokens_per_s: float

    @classmethod
    def of(cls, stats: dict[str, Any]) -> Speed:
        return cls(int(stats.get("new_tokens", 0)), float(stats.get("time_to_first_token_s", 0.0)),
                   float(stats.get("decode_tokens_per_s", 0.0)))

    def line(self) -> str:
        return (f"{self.new_tokens} tokens, time to first token {self.first_token_s * 1e3:.1f} ms, "
                f"{self.tokens_per_s:.1f} tokens/s after it")
