"""Generate with a decoder-only model on any backend: prompt ids in, new ids out, the KV cache kept on the device.

    python examples/generate.py [MODEL_DIR] [--backend vaiml|onnxruntime|openvino|qnn] [--device CPU|NPU]
                                [--prompt-ids 1,17,42] [--max-new-tokens 32] [--stream]

MODEL_DIR holds an export in ONNX Runtime GenAI's / optimum's layout (model.onnx, genai_config.json beside it).
Without one, a small Llama-style decoder with random weights is built (npurt.models.decoders): no language model
ships on PyPI, and tokenizers are the app's (ids in, ids out). Two Generators over one runner run side by side, each
with its own cache (--two).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

from npurt import Generator, RunnerFactory, TensorDirection


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?", help="a folder with model.onnx (and genai_config.json)")
    ap.add_argument("--backend", default="VAIML")
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--prompt-ids", default="1,17,42,99,7,300")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--prefill-chunk", type=int, default=16)
    ap.add_argument("--stream", action="store_true", help="print each id as it is made")
    ap.add_argument("--two", action="store_true", help="two Generators at once over one runner")
    args = ap.parse_args(argv)

    if args.model_dir is None:
        from npurt.models.decoders import build_decoder

        folder = Path(tempfile.mkdtemp(prefix="npurt-decoder-example-"))
        model = build_decoder(folder, "gqa")
        print(f"built a small random-weight decoder in {folder}")
    else:
        model = Path(args.model_dir) / "model.onnx"
        if not model.is_file():
            print(f"error: {model} not found", file=sys.stderr)
            return 1
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    options = {"device": args.device, "decoder": {"max_length": args.max_length,
                                                  "prefill_chunk": args.prefill_chunk}}
    if args.backend.upper() == "OPENVINO":
        options["inference_precision"] = "f32"  # greedy tokens change at near-ties in bf16
    with RunnerFactory.create_runner(args.backend, model, options) as runner:
        print(runner.device_info.summary())
        ins, outs = ([i.name for i in runner.get_tensors_info(d)] for d in (TensorDirection.INPUT,
                                                                             TensorDirection.OUTPUT))
        print("ports:", ins, "->", outs, "(the cache is the Generator's state, not a port)")
        if args.two:
            results: dict[int, list[int]] = {}

            def work(k: int, ids: list[int]) -> None:
                with Generator(runner) as gen:
                    results[k] = gen.generate(ids, args.max_new_tokens)

            threads = [threading.Thread(target=work, args=(k, p)) for k, p in enumerate((prompt, prompt[::-1]))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for k in sorted(results):
                print(f"generator {k}: {results[k]}")
            return 0
        with Generator(runner) as gen:
            if args.stream:
                for token in gen.stream(prompt, args.max_new_tokens):
                    print(token, end=" ", flush=True)
                print()
            else:
                print("ids:", gen.generate(prompt, args.max_new_tokens))
            stats = gen.stats
        print(f"time to first token {stats['time_to_first_token_s'] * 1e3:.1f} ms, "
              f"{stats['decode_tokens_per_s']:.0f} tokens/s, {stats['prefill_chunks']} prefill runs, "
              f"host copies {stats['copies']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
