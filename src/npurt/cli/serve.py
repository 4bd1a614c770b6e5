"""`npurt serve --model NAME=PATH ...`: own the device and the compiled models; other processes run them through it.

The models are loaded (compiled) first; then the service listens on its socket and says READY (a line on stdout,
``--ready-fd``, ``$NOTIFY_SOCKET``). SIGTERM or SIGINT end it cleanly: no new clients or jobs, the jobs in flight
end and are answered, clients are told, the socket file goes. See docs/serve.md.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from .common import EXIT_USAGE, CliError, add_model_options, load_model_file, one_line, parse_shape, resolve_backend


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from ..serve.protocol import default_socket_path
    from ..serve.server import Limits

    d = Limits()
    p = sub.add_parser("serve", parents=[common], help="serve models to other processes over a local socket",
                       description="Own the NPU and the compiled models in one long-running process; other processes "
                                   "run the models through it (npurt.connect(...).open_runner(NAME)), tensors "
                                   "passed by fd.")
    p.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                   help="a model to serve under NAME (repeatable); --shape INPUT=... pins that input of every served "
                        "model that has one, --shape NAME:INPUT=... of one model")
    p.add_argument("--socket", default=None, metavar="PATH",
                   help=f"the socket to listen on (default: {default_socket_path()}; $NPURT_SERVICE or "
                        "$XDG_RUNTIME_DIR/npurt/serve.sock), created with mode 0600")
    p.add_argument("--group", metavar="GROUP", help="let GROUP's members connect too (socket mode 0660)")
    p.add_argument("--allow-uid", action="append", type=int, metavar="UID",
                   help="only these uids may connect (repeatable; checked with SO_PEERCRED)")
    add_model_options(p, "openvino, vaiml or auto", "auto")
    p.add_argument("--hint", choices=("LATENCY", "THROUGHPUT", "latency", "throughput"), default=None,
                   help="the engines' performance hint")
    p.add_argument("--threads", type=int, metavar="N", help="engine threads per run (option num_threads)")
    p.add_argument("--cache-dir", metavar="DIR", help="compiled-model cache (option cache_dir)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="runs at once per served model (default: the runner's max_concurrent_runs, at least the "
                        "number of cores)")
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
    p.add_argument("--ready-fd", type=int, metavar="FD", help="write READY=1 to this inherited fd once listening")
    p.add_argument("--log-level", default="INFO", choices=("ERROR", "WARNING", "INFO", "DEBUG"),
                   help="what the service logs on stderr (who connected, what ran)")
    p.set_defaults(func=run)


def _models(items: list[str]) -> dict[str, Path]:
    models: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CliError(f"--model {item!r}: expected NAME=PATH, e.g. --model cls=models/cls.onnx", EXIT_USAGE)
        if name in models:
            raise CliError(f"--model: the name {name!r} is given twice", EXIT_USAGE)
        models[name] = Path(path)
    return models


def served_defaults(args: argparse.Namespace, models: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each model's runner options from the flags. ``--shape MODEL:INPUT=...`` pins one model's input;
    ``--shape INPUT=...`` every served model's input of that name (each must fit it)."""
    from ..modelinfo import check_input_shapes

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
        base["num_threads"] = args.threads
    if args.cache_dir:
        base["cache_dir"] = args.cache_dir
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
    return {name: {**base, **({"shapes": {n: list(s) for n, s in shapes[name].items()}} if shapes[name] else {})}
            for name in models}


def run(args: argparse.Namespace) -> int:
    from ..serve.protocol import default_socket_path
    from ..serve.readiness import announce_ready, announce_stopping
    from ..serve.server import Limits, Service

    models = _models(args.model)
    for name, path in models.items():
        if not path.is_file():
            raise CliError(f"--model {name}={path}: file not found")
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
    socket_path = Path(args.socket) if args.socket else default_socket_path()
    try:
        service = Service(socket_path, models, backend, defaults, limits, args.workers, args.group)
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
    service.serve_forever(lambda: announce_ready(str(socket_path), args.ready_fd, sorted(models)))
    return 0
