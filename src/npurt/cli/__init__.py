"""The npurt command: devices, info, run, generate, chat, embed, transcribe, bench, cache and serve (one module each).

Every mistake a user can make (a missing file, a file that is no model, an unknown backend or device, a dynamic
model whose sizes cannot be guessed, a bad --input) ends in one line ``npurt: error: ...`` and a non-zero exit
status (1: the command could not do its job; 2: the command line is wrong); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from . import bench, cache, chat, devices, embed, generate, info, run, serve, transcribe
from .common import EXIT_ERROR, EXIT_USAGE, CliError, one_line, parse_device

EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"npurt: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks instead of one-line errors")
    parser = _Parser(prog="npurt", parents=[common],
                     description="npurt: one VART-ML style runtime for NPUs, over OpenVINO and ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"npurt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in (devices, info, run, generate, chat, embed, transcribe, bench, cache, serve):
        command.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "hint", None):
        args.hint = args.hint.upper()
    args.debug = getattr(args, "debug", False)
    try:
        if hasattr(args, "device"):
            args.device = parse_device(args.device)
        return int(args.func(args))
    except CliError as e:
        if args.debug:
            raise
        print(f"npurt: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("npurt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - a user sees one line; --debug shows the traceback
        if args.debug:
            raise
        print(f"npurt: error: {type(e).__name__}: {one_line(e)} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_ERROR


__all__ = ["CliError", "build_parser", "main"]
