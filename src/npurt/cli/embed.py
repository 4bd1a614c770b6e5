"""`npurt embed MODEL_DIR [TEXT ...]`: the embeddings of texts (from the arguments, a file, or stdin) through
``npurt.Embedder``, as sentence-transformers' ``encode`` gives them, on any backend: printed as a summary, as JSON
(``--json``: a list of vectors) or saved as a .npy file (``--npy FILE``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from .common import EXIT_USAGE, CliError, describe_device, engine_options, one_line, resolve_backend

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from .common import add_model_options

    p = sub.add_parser("embed", parents=[common], help="embed texts with a sentence-transformers folder",
                       description="Embed texts with a sentence-transformers folder (onnx/model.onnx beside "
                                   "modules.json, as its ONNX backend saves it) or optimum's feature-extraction "
                                   "export: tokenized, truncated, pooled and normalised as sentence-transformers' "
                                   "encode does, on any backend. Texts come from the arguments, --file (one a line), "
                                   "or stdin (one a line).")
    p.add_argument("model", metavar="MODEL_DIR", help="the model's folder (or its ONNX file)")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed (else --file, else stdin)")
    p.add_argument("--file", metavar="FILE", help="read the texts from FILE, one a line (blank lines skipped; - is "
                                                  "stdin)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the embeddings as JSON: a list of vectors")
    out.add_argument("--npy", metavar="FILE", help="save the embeddings as a numpy .npy file [n, dim]")
    add_model_options(p, "openvino, vaiml, qnn, onnxruntime or auto", "auto", decoder=True)
    p.add_argument("--prompt-name", metavar="NAME", help="one of the folder's prompts (config_sentence_transformers"
                                                         ".json), put before each text")
    p.add_argument("--prompt", metavar="TEXT", help="a prompt put before each text (over --prompt-name)")
    p.add_argument("--normalize", action="store_true", help="unit vectors (after --truncate-dim)")
    p.add_argument("--truncate-dim", type=int, metavar="N", help="keep the first N dims (Matryoshka)")
    p.add_argument("--precision", choices=PRECISIONS, default="float32",
                   help="float32 (default), or quantized as sentence-transformers' quantize_embeddings")
    p.add_argument("--max-length", type=int, metavar="N", help="truncate at N tokens (default: where the folder "
                                                               "says, as sentence-transformers decides it)")
    p.add_argument("--batch-tokens", type=int, metavar="N", help="positions a batch holds at most (default 4096)")
    buckets = p.add_mutually_exclusive_group()
    buckets.add_argument("--bucket", action="append", metavar="BxS",
                         help="pin a [batch, sequence] shape, e.g. --bucket 8x64 (repeatable; default: pinned "
                              "shapes only where the device compiles static shapes)")
    buckets.add_argument("--no-buckets", action="store_true", help="never pin shapes: ragged batches")
    p.set_defaults(func=run)


def _bucket(text: str) -> tuple[int, int]:
    batch, sep, sequence = text.lower().partition("x")
    try:
        pair = (int(batch), int(sequence))
    except ValueError:
        pair = (0, 0)
    if not sep or min(pair) < 1:
        raise CliError(f"--bucket {text!r}: expected BATCHxSEQUENCE with positive integers, e.g. 8x64", EXIT_USAGE)
    return pair


def _texts(args: argparse.Namespace) -> list[str]:
    if args.texts and args.file:
        raise CliError("give the texts as arguments or with --file, not both", EXIT_USAGE)
    if args.texts:
        return list(args.texts)
    if args.file and args.file != "-":
        try:
            content = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"--file {args.file}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    elif args.file == "-" or not sys.stdin.isatty():
        content = sys.stdin.read()
    else:
        raise CliError("no texts: give them as arguments, with --file FILE, or on stdin", EXIT_USAGE)
    texts = [line for line in content.splitlines() if line.strip()]
    if not texts:
        raise CliError(f"no texts in {'stdin' if args.file in (None, '-') else args.file} (blank lines are skipped)",
                       EXIT_USAGE)
    return texts


def run(args: argparse.Namespace) -> int:
    from ..embed import Embedder
    from ..types import NpuError, NpuFallbackWarning

    texts = _texts(args)
    backend = resolve_backend(args.backend)
    options: dict[str, Any] = {"fallback": args.fallback}
    if engine := engine_options(args):
        options["engine_options"] = engine
    buckets: Any = False if args.no_buckets else [_bucket(b) for b in args.bucket] if args.bucket else None
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            embedder = Embedder(args.model, backend, args.device, options, batch_tokens=args.batch_tokens,
                                buckets=buckets, max_length=args.max_length)
        except (FileNotFoundError, ValueError) as e:
            raise CliError(one_line(e), EXIT_USAGE) from None
        except NpuError as e:
            raise CliError(f"{backend} cannot load {args.model}: {one_line(e)}") from None
    fell_back = embedder.runner.device_info.fell_back  # (the device line says it, with the reason)
    notes = [one_line(w.message) for w in caught if not (fell_back and issubclass(w.category, NpuFallbackWarning))]
    load_ms = (time.perf_counter() - t0) * 1e3
    with embedder:
        try:
            tokens = sum(len(ids) for ids in embedder.tokenize(texts, prompt_name=args.prompt_name,
                                                                prompt=args.prompt))
            t1 = time.perf_counter()
            vectors = embedder.encode(texts, prompt_name=args.prompt_name, prompt=args.prompt,
                                      normalize=True if args.normalize else None, truncate_dim=args.truncate_dim,
                                      precision=args.precision, batch_tokens=args.batch_tokens)
            encode_ms = (time.perf_counter() - t1) * 1e3
        except (TypeError, ValueError) as e:
            raise CliError(one_line(e), EXIT_USAGE) from None
        if args.json:
            print(json.dumps(vectors.tolist()))
            return 0
        if args.npy:
            import numpy as np

            try:
                np.save(args.npy, vectors)
            except OSError as e:
                raise CliError(f"--npy {args.npy}: cannot write it ({e.strerror or e})") from None
        lines = [f"Model    {args.model}", f"Backend  {embedder.backend}",
                 "Device   " + "\n         ".join(describe_device(embedder.runner)),
                 "Embedder " + "\n         ".join(embedder.describe()),
                 *(f"Note     {n}" for n in notes),
                 f"Load     {load_ms:.0f} ms",
                 f"Embedded {len(texts)} texts ({tokens} tokens) in {encode_ms:.1f} ms "
                 f"({len(texts) / max(encode_ms / 1e3, 1e-9):.1f} texts/s), {len(embedder.last_batches)} batches: "
                 + ", ".join(f"[{b.shape[0]}, {b.shape[1]}]" for b in embedder.last_batches[:8])
                 + (" ..." if len(embedder.last_batches) > 8 else ""),
                 f"Output   {list(vectors.shape)} {vectors.dtype}" + (f" saved to {args.npy}" if args.npy else "")]
        if not args.npy:
            for i, (text, vector) in enumerate(zip(texts[:10], vectors[:10])):
                head = ", ".join(f"{v:.4f}" if vectors.dtype.kind == "f" else str(v) for v in vector[:4])
                lines.append(f"[{i}] {head}, ...  {text[:50]!r}")
            if len(texts) > 10:
                lines.append(f"... ({len(texts) - 10} more: --json or --npy FILE for all)")
        print("\n".join(lines))
    return 0
