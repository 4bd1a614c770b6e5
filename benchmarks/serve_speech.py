"""Speech over HTTP: ``npurt serve --transcribe`` driven by the official ``openai`` client, four clients against one
(issue 58's "Served": four concurrent clients >= 2x one client's throughput).

- The server: ``npurt serve --transcribe tiny=<whisper tiny.en, optimum's export>`` on ONNX Runtime's CPU provider
  (backend onnxruntime), ``--threads`` intra-op threads a runner (default 1), ``--max-sequences 4``: up to four
  transcriptions at once, each on a thread of its own over the shared runners.
- A client: ``client.audio.transcriptions.create(model="tiny", file=..., temperature=0)`` (greedy, as the
  references decode) for each utterance of the speech clips (3-10 s) in turn.
- Four clients: four threads, each with its own ``openai.OpenAI`` client, the utterances dealt round-robin.
  Throughput: audio seconds transcribed per wall second.

Each round runs both sides once, the order turned each round; the ratio is the median of the rounds' ratios. The
texts are checked equal to the in-process Transcriber's.

    python -m benchmarks.serve_speech [--runs N] [--repeat N] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import openai_clients

CLIENTS = 4
TARGET = 2.0


def served(address: str, clips: list[tuple[Path, float]], clients: int) -> tuple[float, list[str]]:
    """Seconds to transcribe ``clips`` with ``clients`` clients, one file a request; the texts in order."""
    def transcribe(client: Any, i: int) -> str:
        with open(clips[i][0], "rb") as f:
            text: str = client.audio.transcriptions.create(model="tiny", file=f, temperature=0).text
            return text

    return openai_clients(address, len(clips), clients, transcribe, timeout=300)


def run(runs: int, repeat: int, threads: int) -> dict[str, Any]:
    from tools.real_models import path

    from npurt import Transcriber
    from npurt.serve.process import ServiceProcess

    model, clip_dir = path("whisper-optimum"), path("speech-clips")
    listed = json.loads((clip_dir / "clips.json").read_text())["clips"]
    clips = [(clip_dir / c["file"], float(c["seconds"])) for c in listed if c["kind"] == "utterance"] * repeat
    audio_seconds = sum(s for _, s in clips)
    with Transcriber(model, "ONNXRUNTIME", "CPU", {"num_threads": threads}) as local:
        want = [local.transcribe(p).text for p, _ in clips]
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--backend", "onnxruntime", "--device", "CPU", "--threads", str(threads), "--max-sequences",
                str(CLIENTS), "--http", "127.0.0.1:0", "--transcribe", f"tiny={model}"]
        with ServiceProcess.start({}, Path(tmp) / "serve.sock", args) as svc:
            served(svc.http_address, clips[:CLIENTS], CLIENTS)  # warm-up
            for r in range(runs):
                times: dict[str, float] = {}
                for clients in ((1, CLIENTS) if r % 2 == 0 else (CLIENTS, 1)):
                    seconds, texts = served(svc.http_address, clips, clients)
                    if texts != want:
                        raise AssertionError(f"{clients} clients: texts differ from the in-process Transcriber's")
                    times[str(clients)] = seconds
                rounds.append({k: audio_seconds / v for k, v in times.items()})
    ratio = statistics.median(r[str(CLIENTS)] / r["1"] for r in rounds)
    return {"utterances": len(clips), "audio_seconds": round(audio_seconds, 1), "threads": threads, "runs": runs,
            "clients": CLIENTS, "audio_s_per_s": {k: statistics.median(r[k] for r in rounds) for k in ("1", "4")},
            "four_over_one": ratio, "target": TARGET, "met": ratio >= TARGET, "texts_equal_in_process": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_speech", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--repeat", type=int, default=2, help="times each utterance is sent a round (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads a runner, both sides (default 1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.runs, args.repeat, args.threads)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        rate = result["audio_s_per_s"]
        print(f"{result['utterances']} utterances ({result['audio_seconds']} s of audio), {args.threads} thread(s) a "
              f"runner, {args.runs} rounds (medians)")
        print(f"  one client     {rate['1']:6.1f} s of audio per s")
        print(f"  four clients   {rate['4']:6.1f} s of audio per s")
        verdict = "met" if result["met"] else "MISSED"
        print(f"  four / one     {result['four_over_one']:5.2f}x  (target >= {TARGET}x: {verdict})")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
