"""`npurt chat MODEL_DIR [--system TEXT]`: an interactive chat in the terminal over a decoder and its folder's
tokenizer and chat template (``npurt.text.ChatSession``): the reply is printed as it comes, each turn prefills only
what is new (the KV cache is kept across turns), and its speed follows it. /reset starts over, /exit (or end of
input) leaves."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import EXIT_USAGE, CliError
from .decoder import DEFAULT_MAX_LENGTH, Speed, add_decoder_options, load, model_file, sampling, tokenizer

HELP = "/reset: start over (the system message kept), /exit: leave"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("chat", parents=[common], help="chat with a decoder in the terminal (text as it comes)",
                       description="An interactive chat over a decoder-only ONNX export and its folder's tokenizer "
                                   "and chat template: the reply is printed as it comes, the KV cache is kept "
                                   f"across turns (each turn prefills only what is new). {HELP}.")
    add_decoder_options(p)
    p.add_argument("--system", metavar="TEXT", help="a system message first")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                   help="the most tokens a reply makes (default 256; fewer where the cache has less room)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="end a reply at this string (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..generate.generator import Generator
    from ..text.chat import ChatSession

    model = model_file(args.model)
    path = model.model
    tok = tokenizer(args.model, "npurt chat")
    assert tok is not None
    if args.stop and any(not s for s in args.stop):
        raise CliError("--stop: an empty stop string would end every reply before it starts", EXIT_USAGE)
    loaded = load(args, model, max(DEFAULT_MAX_LENGTH, 4 * args.max_new_tokens))
    runner = loaded.runner
    interactive = sys.stdin.isatty()
    try:
        with Generator(runner) as gen:
            try:
                chat = ChatSession(gen, tok, system=args.system, max_new_tokens=args.max_new_tokens,
                                   on_full="drop_oldest", stop=args.stop, **sampling(args))
            except ValueError as e:
                raise CliError(str(e)) from None
            print(f"npurt chat: {path} on {loaded.backend} ({runner.device_info.attached}), cache of "
                  f"{runner.decoder.max_length} tokens. {HELP}.", file=sys.stderr)
            while True:
                try:
                    line = input("> " if interactive else "")
                except EOFError:
                    break
                line = line.strip()
                if not line:
                    continue
                if line in ("/exit", "/quit"):
                    break
                if line == "/reset":
                    chat.reset()
                    print("(conversation reset)", file=sys.stderr)
                    continue
                before = len(chat.messages)
                try:
                    stream = chat.stream(line)
                    for piece in stream:
                        print(piece, end="", flush=True)
                except ValueError as e:  # a template that fails, a message that cannot fit even alone
                    print(f"\nnpurt: {e}", file=sys.stderr)
                    continue
                print(flush=True)
                stats = chat.stats
                dropped = before + 2 > len(chat.messages)
                print(f"[{Speed.of(stats).line()}; prefilled {stats['prompt_tokens']} of "
                      f"{stats['conversation_tokens']} tokens (cached {stats['cached_tokens']})"
                      f"{'; oldest turns dropped to fit' if dropped else ''}"
                      f"{'; cut at max tokens' if stream.result and stream.result.finish_reason == 'length' else ''}]",
                      file=sys.stderr, flush=True)
    finally:
        runner.close()
    return 0
