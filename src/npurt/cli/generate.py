"""`npurt generate MODEL --prompt-ids 1,2,3 --max-new-tokens N`: a decoder's new ids, time to first token and
tokens/s, through option ``decoder`` and ``npurt.Generator`` on any backend (ids in, ids out: no tokenizer)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import EXIT_USAGE, CliError, add_model_options, create_runner, describe_device, resolve_backend

DEFAULT_MAX_LENGTH = 256


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("generate", parents=[common], help="run a decoder: prompt ids in, new ids out",
                       description="Generate with a decoder-only ONNX export (input_ids, attention_mask, "
                                   "past_key_values.* in; logits, present.* out; genai_config.json beside it is "
                                   "read): the static form an NPU compiles is derived from it, the KV cache stays "
                                   "on the device. Prints the new ids, time to first token and tokens/s.")
    p.add_argument("model", metavar="MODEL", help="the decoder's model.onnx")
    add_model_options(p, "openvino, vaiml, qnn, onnxruntime or auto", "auto")
    p.add_argument("--prompt-ids", required=True, metavar="ID,ID,...", help="the prompt's token ids")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="how many ids to make (default 32)")
    p.add_argument("--max-length", type=int, metavar="L",
                   help=f"rows of the KV cache (default: the prompt and the new ids, at least {DEFAULT_MAX_LENGTH}, "
                        "at most the model's context length)")
    p.add_argument("--prefill-chunk", type=int, default=16, metavar="C", help="prompt tokens per run (default 16)")
    p.add_argument("--eos", type=int, metavar="ID",
                   help="stop after this id (default: any of genai_config.json's eos ids)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _prompt(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise CliError(f"--prompt-ids: comma-separated integers, got {text!r}", EXIT_USAGE) from None
    if not ids:
        raise CliError("--prompt-ids: at least one id", EXIT_USAGE)
    return ids


def run(args: argparse.Namespace) -> int:
    from ..generate.folder import resolve
    from ..generate.generator import Generator

    path = Path(args.model)
    prompt = _prompt(args.prompt_ids)
    try:
        context = resolve(path).context_length
    except (FileNotFoundError, ValueError) as e:
        raise CliError(str(e)) from None
    max_length = args.max_length or max(DEFAULT_MAX_LENGTH, len(prompt) + args.max_new_tokens)
    if args.max_length is None and context is not None:
        max_length = min(max_length, context)
    options: dict[str, Any] = {"device": args.device, "fallback": args.fallback, "hw_view": args.hw_view,
                               "decoder": {"max_length": max_length,
                                           "prefill_chunk": min(args.prefill_chunk, max_length)}}
    if args.backend.upper() == "OPENVINO":
        options["inference_precision"] = "f32"  # a decoder's tokens change at near-ties in bf16
    loaded = create_runner(resolve_backend(args.backend), path, options)
    runner = loaded.runner
    try:
        eos = args.eos if args.eos is not None else runner.decoder.eos_token_ids  # each of the config's ends it
        with Generator(runner) as gen:
            try:
                ids = gen.generate(prompt, args.max_new_tokens, eos_token_id=eos, do_sample=args.sample,
                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
            except ValueError as e:
                raise CliError(str(e), EXIT_USAGE) from None
            stats = dict(gen.stats)
        if args.json:
            print(json.dumps({"backend": loaded.backend, "device": runner.device_info.attached, "ids": ids,
                              "stats": stats, "decoder": runner.decoder.describe()}, indent=2))
            return 0
        lines = [f"Model    {path}", f"Backend  {loaded.backend}", *(f"         {n}" for n in loaded.notes),
                 "Device   " + "\n         ".join(describe_device(runner)),
                 f"Decoder  max_length {max_length}, prefill chunk {runner.decoder.prefill_chunk}; cache: "
                 f"{runner.decoder.cache}",
                 f"Prompt   {len(prompt)} ids in {stats['prefill_chunks']} runs of up to "
                 f"{runner.decoder.prefill_chunk}",
                 f"Ids      {','.join(str(i) for i in ids)}",
                 f"Speed    time to first token {stats['time_to_first_token_s'] * 1e3:.1f} ms, "
                 f"{stats['decode_tokens_per_s']:.1f} tokens/s after it, host copies {stats['copies']}"]
        if runner.device_info.full_name and "emulator" in runner.device_info.full_name:
            lines.append("         (an emulator: the NPU's compiler and numerics, not its speed)")
        print("\n".join(lines))
    finally:
        runner.close()
    return 0
