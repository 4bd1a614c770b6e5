"""A chat with a language model that `npurt serve --generate` serves, through the official `openai` client,
unmodified: the server speaks OpenAI's chat completions API.

    npurt serve --generate chat=models/my-decoder --http 127.0.0.1:8000       # terminal 1
    python examples/chat_client.py --model chat                               # terminal 2: type, Enter; /exit

`--message TEXT` (repeatable) sends those turns instead of reading the terminal, each reply streamed as it comes
(the whole conversation goes with every turn; the server prefills only what its cache does not hold already).
`--api-key` (or $OPENAI_API_KEY) is the server's `--token` where it has one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import openai


def reply(client: openai.OpenAI, model: str, messages: list[dict[str, str]], max_tokens: int | None,
          temperature: float) -> tuple[str, dict[str, float]]:
    """Stream one reply to stdout; its text, and its figures (time to first token, tokens/s)."""
    start = time.perf_counter()
    first = 0.0
    parts: list[str] = []
    usage = None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                            temperature=temperature, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text = choice.delta.content or ""
            if text:
                first = first or time.perf_counter()
                parts.append(text)
                print(text, end="", flush=True)
    end = time.perf_counter()
    print()
    made = usage.completion_tokens if usage is not None else 0
    return "".join(parts), {"ttft_ms": (first - start) * 1e3 if first else 0.0,
                            "tokens_per_s": made / (end - first) if first and end > first else 0.0,
                            "tokens": float(made)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's /v1 (default: %(default)s)")
    p.add_argument("--model", required=True, help="the --generate NAME")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"),
                   help="the server's --token, where it has one")
    p.add_argument("--system", help="a system message first")
    p.add_argument("--message", action="append", help="a user turn (repeatable); without it, read the terminal")
    p.add_argument("--max-tokens", type=int, help="per reply (default: what the context has left, capped by the "
                                                  "server's --max-output-tokens)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0 samples")
    p.add_argument("--stats", action="store_true", help="print time to first token and tokens/s after each reply")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    turns = iter(args.message) if args.message else None
    while True:
        if turns is not None:
            text = next(turns, None)
            if text is None:
                return 0
        else:
            try:
                text = input("> ")
            except EOFError:
                return 0
            if text.strip() in ("/exit", "/quit"):
                return 0
            if text.strip() == "/reset":
                messages = messages[:1] if args.system else []
                continue
        messages.append({"role": "user", "content": text})
        try:
            answer, figures = reply(client, args.model, messages, args.max_tokens, args.temperature)
        except openai.APIError as e:
            print(f"error: {e.message}", file=sys.stderr)
            messages.pop()
            if turns is not None:
                return 1
            continue
        messages.append({"role": "assistant", "content": answer})
        if args.stats:
            print(f"[{figures['tokens']:.0f} tokens, first after {figures['ttft_ms']:.1f} ms, "
                  f"{figures['tokens_per_s']:.1f} tokens/s]", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
