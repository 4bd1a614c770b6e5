"""`npurt generate MODEL_DIR --prompt "text"` (or `--prompt-ids 1,2,3`): a decoder's new text and ids, time to first
token and tokens/s, through option ``decoder``, ``npurt.Generator`` and, for text, the folder's tokenizer
(``npurt.text``), on any backend. ``--prompt`` goes through the folder's chat template as a user message where the
folder has one (as OpenVINO GenAI's ``LLMPipeline.generate`` does), as it is with ``--raw`` or where it has none."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import EXIT_USAGE, CliError, describe_device
from .decoder import Speed, add_decoder_options, load, model_file, sampling, tokenizer


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("generate", parents=[common], help="run a decoder: a prompt in, new text (and ids) out",
                       description="Generate with a decoder-only ONNX export (input_ids, attention_mask, "
                                   "past_key_values.* in; logits, present.* out; genai_config.json beside it is "
                                   "read, and tokenizer.json for text): the static form an NPU compiles is derived "
                                   "from it, the KV cache stays on the device. Prints the new text and ids, time to "
                                   "first token and tokens/s.")
    add_decoder_options(p)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT",
                        help="the prompt's text: a user message through the folder's chat template where it has one, "
                             "else (or with --raw) the text as it is; encoded by the folder's tokenizer")
    prompt.add_argument("--prompt-ids", metavar="ID,ID,...", help="the prompt's token ids, as they are")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--chat", action="store_true",
                      help="send --prompt through the chat template, and fail where the folder has none (without "
                           "--chat and --raw: through the template where there is one)")
    form.add_argument("--raw", action="store_true",
                      help="send --prompt as it is (encoded with the tokenizer's special tokens), no chat template")
    p.add_argument("--system", metavar="TEXT", help="a system message before --prompt (needs the chat template)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="how many ids to make (default 32)")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="end the text at this string (repeatable; not shown; needs the tokenizer)")
    p.add_argument("--eos", type=int, metavar="ID",
                   help="stop after this id (default: the eos ids of generation_config.json / genai_config.json / "
                        "the tokenizer)")
    p.add_argument("--json", action="store_true", help="machine-readable output: ids (the new ids) and text")
    p.set_defaults(func=run)


def _prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise CliError(f"--prompt-ids: comma-separated integers, got {text!r}", EXIT_USAGE) from None
    if not ids:
        raise CliError("--prompt-ids: at least one id", EXIT_USAGE)
    return ids


def run(args: argparse.Namespace) -> int:
    from ..generate.generator import Generator
    from ..text import generation

    model = model_file(args.model)
    path = model.model
    if args.prompt is None:  # ids are ids: no template, no tokenizer's special tokens
        for flag, given in (("--chat", args.chat), ("--raw", args.raw), ("--system", args.system is not None)):
            if given:
                raise CliError(f"{flag} is about --prompt's text: give --prompt (--prompt-ids are sent as they are)",
                               EXIT_USAGE)
    if args.raw and args.system is not None:
        raise CliError("--system needs the chat template: leave out --raw", EXIT_USAGE)
    if args.stop and any(not s for s in args.stop):
        raise CliError("--stop: an empty stop string would end the text before it starts", EXIT_USAGE)
    asked = "--prompt" if args.prompt is not None else "--stop" if args.stop else None
    tok = tokenizer(args.model, asked)
    templated = False
    if args.prompt is None:
        prompt: Any = _prompt_ids(args.prompt_ids)
    else:
        assert tok is not None  # (asked for above: --prompt needs it)
        if (args.chat or args.system is not None) and tok.chat_template is None:
            flag = "--chat" if args.chat else "--system"
            raise CliError(f"{flag}: {args.model} has no chat template (chat_template.jinja or tokenizer_config.json's "
                           "chat_template); leave it out to send the text as it is", EXIT_USAGE)
        templated = not args.raw and tok.chat_template is not None
        if templated:
            prompt = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
                {"role": "user", "content": args.prompt}]
        else:
            prompt = args.prompt
    try:
        ids = generation.prompt_ids(tok, prompt) if tok is not None else list(prompt)
    except ValueError as e:  # a template that fails
        raise CliError(str(e)) from None
    loaded = load(args, model, len(ids) + args.max_new_tokens)
    runner = loaded.runner
    try:
        with Generator(runner) as gen:
            eos = [args.eos] if args.eos is not None else list(dict.fromkeys(
                [*(tok.eos_token_ids if tok is not None else ()), *runner.decoder.eos_token_ids]))
            try:
                if tok is not None:
                    result = generation.generate_text(gen, tok, ids, args.max_new_tokens, stop=args.stop,
                                                      eos_token_id=eos, **sampling(args))
                    new, text, reason = result.ids, result.text, result.finish_reason
                else:
                    new = gen.generate(ids, args.max_new_tokens, eos_token_id=eos, **sampling(args))
                    text, reason = None, "stop" if new and new[-1] in eos else "length"
            except ValueError as e:
                raise CliError(str(e), EXIT_USAGE) from None
            stats = dict(gen.stats)
        form = "ids as given" if args.prompt is None else "chat template" if templated else "raw text"
        cache_dir = str(loaded.cache_dir) if loaded.cache_dir is not None else None
        steps = [[what, round(ms, 1)] for what, ms in runner.device_info.load_steps]
        if args.json:
            print(json.dumps({"backend": loaded.backend, "device": runner.device_info.attached, "ids": new,
                              "text": text, "finish_reason": reason, "prompt_ids": ids, "prompt_form": form,
                              "stats": stats, "decoder": runner.decoder.describe(), "cache_dir": cache_dir,
                              "load_ms": round(loaded.load_ms, 1), "load_steps": steps,
                              "engine_settings": dict(runner.device_info.engine_settings)},
                             indent=2, ensure_ascii=False))
            return 0
        lines = [f"Model    {path}", f"Backend  {loaded.backend}", *(f"         {n}" for n in loaded.notes),
                 "Device   " + "\n         ".join(describe_device(runner)),
                 f"Decoder  max_length {runner.decoder.max_length}, prefill chunk {runner.decoder.prefill_chunk}; "
                 f"cache: {runner.decoder.cache}",
                 f"Load     {loaded.load_ms:.0f} ms ({', '.join(dict.fromkeys(w for w, _ in steps[1:])) or '-'}); "
                 f"npurt's cache: {cache_dir or 'off'}",
                 f"Prompt   {len(ids)} ids ({form}) in {stats['prefill_chunks']} runs",
                 f"Ids      {','.join(str(i) for i in new)}"]
        if text is not None:
            lines.append(f"Text     {text!r} (finish: {reason})")
        lines.append(f"Speed    {Speed.of(stats).line()}, host copies {stats['copies']}")
        if runner.device_info.full_name and "emulator" in runner.device_info.full_name:
            lines.append("         (an emulator: the NPU's compiler and numerics, not its speed)")
        print("\n".join(lines))
        sys.stdout.flush()
    finally:
        runner.close()
    return 0
