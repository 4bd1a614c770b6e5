"""`npurt serve --model NAME=PATH ...`: own the device and the compiled models; other processes run them through it.

The models are loaded (compiled) first; then the service listens on its socket (and, with ``--http`` / ``--grpc``,
speaks KServe's Open Inference Protocol over the network) and says READY (a line on stdout, ``--ready-fd``,
``$NOTIFY_SOCKET``). SIGTERM or SIGINT end it cleanly: no new clients, jobs or requests (503), the ones in flight end
and are answered, clients are told, the socket file goes. See docs/serve.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from .common import (
    CACHE_DIR_ENV,
    EXIT_USAGE,
    CliError,
    add_model_options,
    cache_dir_of,
    engine_options,
    load_model_file,
    one_line,
    parse_frame,
    parse_shape,
    resolve_backend,
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve models to other processes over a local socket",
                       description="Own the NPU and the compiled models in one long-running process; other processes "
                                   "run the models through it (npurt.connect(...).open_runner(NAME)), tensors "
                                   "passed by fd; with --http / --grpc, over KServe's Open Inference Protocol too.")
    _add_models(p)
    _add_generate(p)
    _add_embed(p)
    _add_transcribe(p)
    _add_socket_limits(p)
    _add_oip(p)
    p.add_argument("--ready-fd", type=int, metavar="FD", help="write READY=1 to this inherited fd once listening")
    p.add_argument("--log-level", default="INFO", choices=("ERROR", "WARNING", "INFO", "DEBUG"),
                   help="what the service logs on stderr (who connected, what ran)")
    p.set_defaults(func=run)


def _add_models(p: argparse.ArgumentParser) -> None:
    """What is served, and how it is compiled and run."""
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                   help="a model to serve under NAME (repeatable); --shape INPUT=... pins that input of every served "
                        "model that has one, --shape NAME:INPUT=... of one model")
    add_model_options(p, "openvino, vaiml, qnn, onnxruntime or auto", "auto")
    p.add_argument("--hint", choices=("LATENCY", "THROUGHPUT", "latency", "throughput"), default=None,
                   help="the engines' performance hint")
    p.add_argument("--threads", type=int, metavar="N", help="engine threads per run (option num_threads)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache-dir", metavar="DIR",
                       help="npurt's cache (option cache_dir) for every served model: compiled models, and the "
                            "--generate decoders' derived forms and verdicts (default: --model runners none; "
                            f"--generate decoders ${CACHE_DIR_ENV}, else $XDG_CACHE_HOME/npurt/compiled, else "
                            "~/.cache/npurt/compiled, so that a restart reuses what was derived and checked)")
    cache.add_argument("--no-cache", action="store_true",
                       help="no cache for any model: the --generate decoders are derived and checked afresh at start")
    p.add_argument("--workers", type=int, metavar="N",
                   help="runs at once per served model (default: the runner's max_concurrent_runs, at least the "
                        "number of cores)")


def _add_generate(p: argparse.ArgumentParser) -> None:
    """Language models: OpenAI's API and Triton's generate extension on the --http listener."""
    from ..serve.llm.settings import GenerationSettings  # no aiohttp there: --help needs no 'serve' extra

    d = GenerationSettings()
    g = p.add_argument_group("language models (OpenAI's /v1 API and Triton's generate on --http; see docs/serve.md)")
    g.add_argument("--generate", action="append", default=[], metavar="NAME=MODEL_DIR",
                   help="serve a decoder folder (model.onnx, genai_config.json, tokenizer files) under NAME "
                        "(repeatable); --backend, --device, --threads and --cache-dir apply to it too")
    g.add_argument("--max-length", type=int, metavar="L",
                   help="rows of each sequence's cache: the context a request's prompt and max_tokens share "
                        "(default: the model's context length, at most 2048)")
    g.add_argument("--prefill-chunk", type=int, default=d.prefill_chunk, metavar="C",
                   help="prompt ids per run while other sequences generate (default: %(default)s)")
    g.add_argument("--max-sequences", type=int, default=d.max_sequences, metavar="N",
                   help="sequences generating at once, each with a cache of its own (default: %(default)s)")
    g.add_argument("--max-queue", type=int, default=d.max_queue, metavar="N",
                   help="requests waiting for a free cache; more get 429 with Retry-After (default: %(default)s)")
    g.add_argument("--max-output-tokens", type=int, default=d.max_output_tokens, metavar="N",
                   help="ids a request that leaves max_tokens out may make, at most (default: %(default)s)")
    reuse = g.add_mutually_exclusive_group()
    reuse.add_argument("--prefix-reuse", action="store_true",
                       help="take a free cache that holds the start of a prompt (e.g. a chat's earlier turns) and "
                            "prefill only the rest: less prefill, but a prompt split into other runs gives other "
                            "logits (fp32 ~3e-5, int4 at accuracy level 4 up to 0.58), so identical requests may "
                            "answer differently; off by default")
    reuse.add_argument("--no-prefix-reuse", action="store_true",
                       help="prefill every prompt whole, in one run (the default)")
    batch = g.add_mutually_exclusive_group()
    batch.add_argument("--batch", default="auto", metavar="SIZES",
                       help="run the sequences' decode steps batched, in runs of these sizes (e.g. 1,2,4,8; the "
                            "largest is a pool's rows); 1: one sequence a run. Default auto: on the ONNX Runtime "
                            "backends up to 8 rows (a Concat cache only up to --max-length 512); off for int4 with "
                            "int8 activations (a step batched with another row gives other logits, up to 0.43: "
                            "--batch 1,2 still batches it, 1.2-1.8x) and on OpenVINO")
    batch.add_argument("--no-batch", action="store_true", help="one sequence's step a run (as --batch 1)")


def _add_embed(p: argparse.ArgumentParser) -> None:
    """Embedding models: OpenAI's /v1/embeddings on the --http listener."""
    from ..serve.embed.settings import EmbedSettings  # no aiohttp there: --help needs no 'serve' extra

    d = EmbedSettings()
    g = p.add_argument_group("embedding models (OpenAI's /v1/embeddings on --http; see docs/serve.md)")
    g.add_argument("--embed", action="append", default=[], metavar="NAME=MODEL_DIR",
                   help="serve an embedding folder (sentence-transformers' with onnx/model.onnx, or optimum's "
                        "feature-extraction export) under NAME (repeatable); --backend, --device and --threads apply")
    g.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens, metavar="T",
                   help="tokens one run gathers from the requests waiting (default: %(default)s)")
    g.add_argument("--max-inputs", type=int, default=d.max_inputs, metavar="N",
                   help="inputs one request may carry (default: %(default)s, as OpenAI)")
    g.add_argument("--auto-truncate", action="store_true",
                   help="cut an input past the model's maximum length there, as sentence-transformers does "
                        "(default: 400, as OpenAI answers an input past its context)")


def _add_transcribe(p: argparse.ArgumentParser) -> None:
    """Speech models: OpenAI's /v1/audio/transcriptions (and translations) on the --http listener."""
    g = p.add_argument_group("speech models (OpenAI's /v1/audio/transcriptions on --http; see docs/speech.md)")
    g.add_argument("--transcribe", action="append", default=[], metavar="NAME=MODEL_DIR",
                   help="serve a Whisper folder (optimum's export) under NAME (repeatable); --backend, --device and "
                        "--threads apply, and --max-sequences (transcriptions at once) and --max-queue (waiting)")
    g.add_argument("--max-audio-seconds", type=float, default=3600.0, metavar="S",
                   help="longer audio is refused before it is decoded (default: %(default)s)")


def speech_settings(args: argparse.Namespace) -> Any:
    from ..serve.speech.settings import SpeechSettings

    if not args.max_audio_seconds > 0:
        raise CliError(f"--max-audio-seconds {args.max_audio_seconds}: must be more than 0", EXIT_USAGE)
    if not args.transcribe and args.max_audio_seconds != 3600.0:
        raise CliError("--max-audio-seconds is for speech models: give --transcribe NAME=MODEL_DIR", EXIT_USAGE)
    return SpeechSettings(max_active=args.max_sequences, max_queue=args.max_queue,
                          max_audio_seconds=args.max_audio_seconds)


def embed_settings(args: argparse.Namespace) -> Any:
    from ..serve.embed.settings import EmbedSettings

    d = EmbedSettings()
    if not args.embed:
        for flag, value, default in (("max_batch_tokens", args.max_batch_tokens, d.max_batch_tokens),
                                     ("max_inputs", args.max_inputs, d.max_inputs),
                                     ("auto_truncate", args.auto_truncate, False)):
            if value != default:
                raise CliError(f"--{flag.replace('_', '-')} is for embedding models: give --embed NAME=MODEL_DIR",
                               EXIT_USAGE)
    for value, flag in ((args.max_batch_tokens, "--max-batch-tokens"), (args.max_inputs, "--max-inputs")):
        if value < 1:
            raise CliError(f"{flag} {value}: must be 1 or more", EXIT_USAGE)
    return EmbedSettings(max_batch_tokens=args.max_batch_tokens, max_inputs=args.max_inputs,
                         auto_truncate=args.auto_truncate)


def generation_settings(args: argparse.Namespace) -> Any:
    from ..serve.llm.settings import GenerationSettings

    if not args.generate:  # a flag of --generate's without it would be ignored: refused, as the OIP's are
        d = GenerationSettings()
        shared = () if args.transcribe else (("max_sequences", args.max_sequences, d.max_sequences),
                                             ("max_queue", args.max_queue, d.max_queue))
        for flag, value, default in (("max_length", args.max_length, None),
                                     ("prefill_chunk", args.prefill_chunk, d.prefill_chunk), *shared,
                                     ("max_output_tokens", args.max_output_tokens, d.max_output_tokens),
                                     ("prefix_reuse", args.prefix_reuse, False),
                                     ("no_prefix_reuse", args.no_prefix_reuse, False),
                                     ("batch", args.batch, "auto"), ("no_batch", args.no_batch, False)):
            if value != default:
                raise CliError(f"--{flag.replace('_', '-')} is for language models: give --generate NAME=MODEL_DIR",
                               EXIT_USAGE)

    for value, flag in ((args.prefill_chunk, "--prefill-chunk"), (args.max_sequences, "--max-sequences"),
                        (args.max_output_tokens, "--max-output-tokens"), (args.max_length or 1, "--max-length")):
        if value < 1:
            raise CliError(f"{flag} {value}: must be 1 or more", EXIT_USAGE)
    if args.max_queue < 0:
        raise CliError(f"--max-queue {args.max_queue}: must be 0 or more", EXIT_USAGE)
    return GenerationSettings(max_length=args.max_length, prefill_chunk=args.prefill_chunk,
                              max_sequences=args.max_sequences, max_queue=args.max_queue,
                              max_output_tokens=args.max_output_tokens, prefix_reuse=args.prefix_reuse,
                              batch=batch_flag(args))


def batch_flag(args: argparse.Namespace) -> tuple[int, ...] | None:
    """--batch / --no-batch: the batch sizes (None: decided per backend and precision; (): off)."""
    from ..options import MAX_DECODER_BATCH

    if args.no_batch:
        return ()
    text = str(args.batch).strip().lower()
    if text == "auto":
        return None
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise CliError(f"--batch {args.batch}: batch sizes separated by commas (e.g. 1,2,4,8), or auto",
                       EXIT_USAGE) from None
    if not 1 <= sizes[0] <= sizes[-1] <= MAX_DECODER_BATCH:
        raise CliError(f"--batch {args.batch}: each size from 1 to {MAX_DECODER_BATCH}", EXIT_USAGE)
    if sizes[-1] > 1 and str(args.backend).upper() == "OPENVINO":
        raise CliError(f"--batch {args.batch}: OpenVINO keeps a decoder's cache per infer request, its steps are not "
                       "batched across sequences (leave --batch out)", EXIT_USAGE)
    return sizes


def _add_socket_limits(p: argparse.ArgumentParser) -> None:
    """The local socket: where, who may connect, and each client's limits."""
    from ..serve.protocol import default_socket_path
    from ..serve.server import Limits

    d = Limits()
    p.add_argument("--socket", default=None, metavar="PATH",
                   help=f"the socket to listen on (default: {default_socket_path()}; $NPURT_SERVICE or "
                        "$XDG_RUNTIME_DIR/npurt/serve.sock), created with mode 0600")
    p.add_argument("--group", metavar="GROUP", help="let GROUP's members connect too (socket mode 0660)")
    p.add_argument("--allow-uid", action="append", type=int, metavar="UID",
                   help="only these uids may connect (repeatable; checked with SO_PEERCRED)")
    p.add_argument("--max-clients", type=int, default=d.max_clients, metavar="N")
    p.add_argument("--max-connections-per-uid", type=int, default=d.max_connections_per_uid, metavar="N")
    p.add_argument("--max-jobs-per-client", type=int, default=d.max_jobs_per_client, metavar="N",
                   help="runs queued or running per connection (more: RESOURCE_UNAVAILABLE)")
    p.add_argument("--max-mapped-mb-per-client", type=int, default=d.max_mapped_bytes_per_client >> 20, metavar="MB",
                   help="tensor memory one connection may register (more: OUT_OF_MEMORY)")
    p.add_argument("--max-bindings-per-client", type=int, default=d.max_bindings_per_client, metavar="N")
    p.add_argument("--max-runners", type=int, default=d.max_runners, metavar="N",
                   help="served runners (a model with one set of options each) in all")
    p.add_argument("--handshake-timeout", type=float, default=d.handshake_timeout_s, metavar="S",
                   help="how long a new connection may take to say HELLO (default: %(default)s)")
    p.add_argument("--send-timeout", type=float, default=d.send_timeout_s, metavar="S",
                   help="a client that leaves its answers unread this long is disconnected (default: %(default)s)")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s, metavar="S",
                   help="on SIGTERM/SIGINT, how long the jobs already accepted may take (default: %(default)s)")


def _add_oip(p: argparse.ArgumentParser) -> None:
    """The Open Inference Protocol: listeners, who may use them, and each request's limits."""
    oip = p.add_argument_group("Open Inference Protocol (KServe v2; needs the 'serve' extra)")
    oip.add_argument("--http", metavar="HOST:PORT", help="serve HTTP/REST there (e.g. 127.0.0.1:8000; port 0: any "
                                                         "free port, printed on the READY line)")
    oip.add_argument("--grpc", metavar="HOST:PORT", help="serve gRPC there (e.g. 127.0.0.1:8001)")
    oip.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (health probes and /metrics excepted); "
                                     f"${TOKEN_ENV} or --token-file keep it off the command line")
    oip.add_argument("--token-file", metavar="PATH", help="read the token from this file")
    oip.add_argument("--no-auth", action="store_true",
                     help="listen beyond loopback without a token (refused otherwise): anyone who reaches the server "
                          "may run the models")
    oip.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS and gRPC over TLS with this certificate chain")
    oip.add_argument("--tls-key", metavar="PEM", help="... and this private key")
    oip.add_argument("--insecure", action="store_true",
                     help="allow a token over plain text beyond loopback (TLS ends before this server: an ingress, "
                          "a service mesh)")
    oip.add_argument("--shm", choices=("auto", "on", "off"), default="auto",
                     help="Triton's system shared memory, for clients on this host only (default: auto, on where "
                          "every listener binds loopback; off: 403 / PERMISSION_DENIED)")
    from ..serve.oip.codec import OipLimits  # numpy only: --help needs no 'serve' extra

    d = OipLimits()
    oip.add_argument("--max-in-flight", type=int, default=d.max_in_flight, metavar="N",
                     help="requests admitted at once, both protocols; more: 503 / UNAVAILABLE (default: %(default)s)")
    oip.add_argument("--body-idle-timeout", type=float, default=d.body_idle_s, metavar="S",
                     help="an HTTP request body that sends nothing for S seconds is answered 408: an admitted request "
                          "holds its --max-in-flight slot while its body arrives (default: %(default)s)")
    oip.add_argument("--max-body-mb", type=int, default=d.max_body_bytes >> 20, metavar="MB",
                     help="largest HTTP body / gRPC message (default: %(default)s)")
    oip.add_argument("--max-json-mb", type=int, default=d.max_json_bytes >> 20, metavar="MB",
                     help="largest JSON part of an HTTP infer request, parsed off the event loop (default: "
                          "%(default)s)")
    oip.add_argument("--max-header-kb", type=int, default=d.max_header_bytes >> 10, metavar="KB",
                     help="largest HTTP request line or header field, and gRPC metadata (default: %(default)s)")
    oip.add_argument("--max-tensors", type=int, default=d.max_tensors, metavar="N",
                     help="inputs plus requested outputs per request (default: %(default)s)")
    oip.add_argument("--max-elements", type=int, default=d.max_elements, metavar="N",
                     help="elements of all inputs of one request (default: %(default)s)")


TOKEN_ENV = "NPURT_SERVE_TOKEN"


def oip_config(args: argparse.Namespace) -> Any:
    """The Open Inference Protocol's settings from the flags (None without --http / --grpc), checked for safety;
    the warnings are printed loudly."""
    if not args.http and not args.grpc:
        for flag in ("token", "token_file", "tls_cert", "tls_key", "no_auth"):
            if getattr(args, flag):
                raise CliError(f"--{flag.replace('_', '-')} is for the Open Inference Protocol: give --http or --grpc",
                               EXIT_USAGE)
        return None
    try:
        from ..serve.oip.codec import OipLimits
        from ..serve.oip.server import OipConfig, check_config, parse_address
    except ImportError as e:
        raise CliError(f"--http / --grpc need the 'serve' extra (pip install 'npurt[serve]'): {e}") from None
    token = args.token
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as e:
            raise CliError(f"--token-file {args.token_file}: {e.strerror}", EXIT_USAGE) from None
    token = token or os.environ.get(TOKEN_ENV) or None
    for value, flag in ((args.max_body_mb, "--max-body-mb"), (args.max_header_kb, "--max-header-kb"),
                        (args.max_tensors, "--max-tensors"), (args.max_elements, "--max-elements"),
                        (args.max_json_mb, "--max-json-mb"), (args.max_in_flight, "--max-in-flight")):
        if value < 1:
            raise CliError(f"{flag} {value}: must be 1 or more", EXIT_USAGE)
    if not args.body_idle_timeout > 0:
        raise CliError(f"--body-idle-timeout {args.body_idle_timeout}: must be more than 0", EXIT_USAGE)
    try:
        config = OipConfig(http=parse_address(args.http, "--http") if args.http else None,
                           grpc=parse_address(args.grpc, "--grpc") if args.grpc else None, token=token,
                           tls_cert=Path(args.tls_cert) if args.tls_cert else None,
                           tls_key=Path(args.tls_key) if args.tls_key else None, insecure=args.insecure,
                           no_auth=args.no_auth, shm=args.shm,
                           limits=OipLimits(max_header_bytes=args.max_header_kb << 10,
                                            max_body_bytes=args.max_body_mb << 20,
                                            max_json_bytes=args.max_json_mb << 20, max_tensors=args.max_tensors,
                                            max_elements=args.max_elements, max_in_flight=args.max_in_flight,
                                            body_idle_s=args.body_idle_timeout))
        warnings = check_config(config)
    except ValueError as e:
        raise CliError(one_line(e), EXIT_USAGE) from None
    for warning in warnings:
        banner = "!" * 100
        print(f"{banner}\nnpurt serve: WARNING: {warning}\n{banner}", file=sys.stderr, flush=True)
        logging.getLogger("npurt.serve").warning("%s", warning)
    return config


def _models(items: list[str], flag: str = "--model") -> dict[str, Path]:
    models: dict[str, Path] = {}
    example = "cls=models/cls.onnx" if flag == "--model" else "chat=models/llama"
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CliError(f"{flag} {item!r}: expected NAME=PATH, e.g. {flag} {example}", EXIT_USAGE)
        if name in models:
            raise CliError(f"{flag}: the name {name!r} is given twice", EXIT_USAGE)
        models[name] = Path(path)
    return models


def _folders(items: list[str], flag: str) -> dict[str, Path]:
    """``flag``'s NAME=DIR pairs, each DIR an existing folder."""
    folders = _models(items, flag)
    for name, path in folders.items():
        if not path.is_dir():
            raise CliError(f"{flag} {name}={path}: no such folder")
    return folders


def base_options(args: argparse.Namespace) -> dict[str, Any]:
    """The runner options every served model takes from the flags (device, threads, cache...)."""
    base: dict[str, Any] = {}
    if args.device != "AUTO":
        base["device"] = args.device
    if args.fallback != "cpu":
        base["fallback"] = args.fallback
    if args.hw_view != "device":
        base["hw_view"] = args.hw_view
    if args.hint:
        base["performance_hint"] = args.hint.upper()
    if args.threads is not None:
        if args.threads < 1:
            raise CliError(f"--threads {args.threads}: must be 1 or more", EXIT_USAGE)
        base["num_threads"] = args.threads
    if args.cache_dir:
        base["cache_dir"] = args.cache_dir
    if engine := engine_options(args):
        base["engine_options"] = engine
    return base


def decoder_options(args: argparse.Namespace) -> dict[str, Any]:
    """The --generate decoders' runner options: ``base_options``, with npurt's default cache directory where neither
    --cache-dir nor --no-cache is given (a decoder's derivation and check cost a second or more per load; a
    --model runner's compile is kept only where --cache-dir asks, as before)."""
    options = base_options(args)
    cache, note = cache_dir_of(args)
    if note:
        logging.getLogger("npurt.serve").warning("%s", note)
    if cache is not None:
        options["cache_dir"] = str(cache)
    return options


def served_defaults(args: argparse.Namespace, models: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each model's runner options from the flags. ``--shape MODEL:INPUT=...`` pins one model's input;
    ``--shape INPUT=...`` every served model's input of that name (each must fit it)."""
    from ..modelinfo import check_input_shapes

    base = base_options(args)
    declared = {name: load_model_file(path) for name, path in models.items()}
    shapes: dict[str, dict[str, tuple[int, ...]]] = {name: {} for name in models}
    for item in args.shape or ():
        name, shape = parse_shape(item)
        model, sep, input_name = name.partition(":")
        targets = [model] if sep and model in models else [m for m in models if declared[m].input(name)]
        if not sep or model not in models:
            input_name = name
        if not targets:
            raise CliError(f"--shape {item}: no served model has an input {input_name!r}", EXIT_USAGE)
        for target in targets:
            try:
                check_input_shapes(declared[target], {input_name: shape}, f"--shape (model {target})")
            except ValueError as e:
                raise CliError(f"{e}; pin one model's input with --shape MODEL:INPUT=...", EXIT_USAGE) from None
            if input_name in shapes[target]:
                raise CliError(f"--shape: input {input_name!r} of model {target!r} is given twice", EXIT_USAGE)
            shapes[target][input_name] = shape
    frames: dict[str, dict[str, Any]] = {name: {} for name in models}
    for item in args.frame or ():  # --frame MODEL:INPUT=... for one model, --frame INPUT=... for each that has it
        name, spec = parse_frame(item)
        model, sep, input_name = name.partition(":")
        if not sep or model not in models:
            model, input_name = "", name
        targets = [model] if model else [m for m in models if declared[m].input(input_name)]
        if not targets:
            raise CliError(f"--frame {item}: no served model has an input {input_name!r}", EXIT_USAGE)
        for target in targets:
            frames[target][input_name] = spec
    return {name: {**base, **({"shapes": {n: list(s) for n, s in shapes[name].items()}} if shapes[name] else {}),
                   **({"frames": frames[name]} if frames[name] else {})}
            for name in models}


def language_models(args: argparse.Namespace) -> Any:
    """--generate: decoder folders, OpenAI's completions and chat and Triton's generate (a ``ModelKind``)."""
    from ..serve.openai.kinds import ModelKind

    folders = _models(args.generate, "--generate")
    for name, path in folders.items():
        if not path.exists():
            raise CliError(f"--generate {name}={path}: no such folder or file")
    settings = generation_settings(args)
    options = decoder_options(args) if folders else {}

    def load(backend: str, registry: Any) -> Any:
        from ..serve.llm.kind import load_language_models

        return load_language_models(folders, settings, options, backend, registry)

    return ModelKind("--generate", folders, load, "language models")


def embedding_options(args: argparse.Namespace) -> dict[str, Any]:
    """The runner options of the --embed models: the flags', and the THROUGHPUT hint where neither --hint nor
    --threads is given. A served embedding model answers many clients whose sentences are short: runs of a few rows
    each, one per core at once, serve eight clients 1.3-2.1x one alone and 0.78-1.2x the in-process rate on 2 cores,
    where one run of every thread gave 1.0-1.25x and 0.7x (issue 59, docs/performance.md section 9); ``--hint
    latency`` gives one client each run's every thread."""
    options = base_options(args)
    if "performance_hint" not in options and "num_threads" not in options:
        options["performance_hint"] = "THROUGHPUT"
    return options


def embedding_models(args: argparse.Namespace) -> Any:
    """--embed: embedding folders, OpenAI's /v1/embeddings (a ``ModelKind``)."""
    from ..serve.openai.kinds import ModelKind

    folders = _folders(args.embed, "--embed")
    settings = embed_settings(args)
    options = embedding_options(args) if folders else {}

    def load(backend: str, registry: Any) -> Any:
        from ..serve.embed.kind import load_embedding_models

        return load_embedding_models(folders, settings, options, backend)

    return ModelKind("--embed", folders, load, "embedding models")


def speech_models(args: argparse.Namespace) -> Any:
    """--transcribe: Whisper folders, OpenAI's /v1/audio/transcriptions and translations (a ``ModelKind``)."""
    from ..serve.openai.kinds import ModelKind

    folders = _folders(args.transcribe, "--transcribe")
    if folders:  # libsndfile before any model's engine: loaded after the QNN EP it crashes (speech/audio.py)
        from ..speech.audio import load_decoder

        load_decoder()
    settings = speech_settings(args)
    options = base_options(args) if folders else {}

    def load(backend: str, registry: Any) -> Any:
        from ..serve.speech.kind import load_speech_models

        return load_speech_models(folders, settings, options, backend)

    return ModelKind("--transcribe", folders, load, "speech models")


def run(args: argparse.Namespace) -> int:
    from ..serve.protocol import default_socket_path
    from ..serve.readiness import announce_ready, announce_stopping
    from ..serve.server import Limits, Service

    models = _models(args.model)
    for name, path in models.items():
        if not path.is_file():
            raise CliError(f"--model {name}={path}: file not found")
    kinds = [language_models(args), embedding_models(args), speech_models(args)]  # served over OpenAI's API on --http
    if not models and not any(kind.folders for kind in kinds):
        raise CliError("give a model to serve: --model NAME=PATH (or --generate, --embed or --transcribe "
                       "NAME=MODEL_DIR)", EXIT_USAGE)
    for kind in kinds:
        if kind.folders and not args.http:
            raise CliError(f"{kind.flag} serves {kind.what} over HTTP: give --http HOST:PORT (e.g. 127.0.0.1:8000)",
                           EXIT_USAGE)
    defaults = served_defaults(args, models)
    backend = resolve_backend(args.backend)
    for value, flag in ((args.max_clients, "--max-clients"), (args.max_jobs_per_client, "--max-jobs-per-client"),
                        (args.max_connections_per_uid, "--max-connections-per-uid"),
                        (args.max_mapped_mb_per_client, "--max-mapped-mb-per-client"),
                        (args.max_bindings_per_client, "--max-bindings-per-client"),
                        (args.max_runners, "--max-runners"), (args.workers or 1, "--workers")):
        if value < 1:
            raise CliError(f"{flag} {value}: must be 1 or more", EXIT_USAGE)
    limits = Limits(max_clients=args.max_clients, max_connections_per_uid=args.max_connections_per_uid,
                    max_jobs_per_client=args.max_jobs_per_client,
                    max_mapped_bytes_per_client=args.max_mapped_mb_per_client << 20,
                    max_bindings_per_client=args.max_bindings_per_client, max_runners=args.max_runners,
                    drain_timeout_s=args.drain_timeout, handshake_timeout_s=args.handshake_timeout,
                    send_timeout_s=args.send_timeout,
                    allowed_uids=frozenset(args.allow_uid) if args.allow_uid else None)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s npurt serve[%(process)d]: %(message)s")
    logging.getLogger("npurt.serve").setLevel(args.log_level)
    oip = oip_config(args)
    socket_path = Path(args.socket) if args.socket else default_socket_path()
    try:
        service = Service(socket_path, models, backend, defaults, limits, args.workers, args.group, oip, kinds)
    except ValueError as e:
        raise CliError(one_line(e), EXIT_USAGE) from e

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        announce_stopping(name)
        service.stop(f"{name} received")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        service.start()
    except (ValueError, OSError) as e:
        raise CliError(one_line(e)) from e
    except Exception as e:
        raise CliError(f"cannot start the service: {one_line(e)}") from e
    oip_server = service.oip
    http = oip_server.http_address if oip_server is not None else ""
    grpc = oip_server.grpc_address if oip_server is not None else ""
    names = sorted({*models, *(name for kind in kinds for name in kind.names)})
    service.serve_forever(lambda: announce_ready(str(socket_path), args.ready_fd, names, http, grpc))
    return 0
