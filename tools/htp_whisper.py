"""Issue 58 by hand: the real whisper tiny.en (tools/real_models' whisper-optimum) on Qualcomm's HTP emulator
through npurt's Transcriber (backend QNN, device NPU: pinned shapes, so the static self-attention cache), on the
shortest speech clip; then plain ONNX Runtime (CPU EP, fp32) over the same export for the top-two logit gaps.

By hand, not in the suite (the emulator runs the real encoder's window in ~2 minutes); from the repository's root,
pinned to one core:
    taskset -c 1 .venv/bin/python -m tools.htp_whisper htp OUT_DIR [MODEL]   (MODEL: whisper-optimum, or whisper-random)
    taskset -c 1 .venv/bin/python -m tools.htp_whisper cpu OUT_DIR [MODEL]   (after htp: reads its files)
htp writes OUT_DIR/htp.json (ids, per-step timings and HTP top-two gaps, placement, describe, stats),
OUT_DIR/features.npy (the features npurt computed) and OUT_DIR/hidden_htp.npy (the HTP encoder's output);
cpu writes OUT_DIR/cpu.json: raw onnxruntime CPU greedy over the same features, its masked top-two gaps along its
own ids, along the reference's ids and along the HTP's ids (teacher-forced), and the CPU decoder over the HTP's
encoder output (same, teacher-forced along the HTP's ids).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import wave
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tools.real_models import path as folder
from tools.real_models import reference

CLIP = "fox"  # the shortest of speech-clips (3.20 s)
LOG: Any = None
T0 = time.time()


def log(msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S', time.gmtime())} +{time.time() - T0:7.1f}s load={os.getloadavg()} {msg}"
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def samples_of(name: str) -> np.ndarray:
    clips = folder("speech-clips")
    with wave.open(str(clips / f"{name}.wav")) as audio:
        return np.frombuffer(audio.readframes(audio.getnframes()), np.int16).astype(np.float32) / 32768


def ref_ids(model: str) -> list[int]:
    ref = reference(model)
    clip = next(c for c in ref["clips"] if c["clip"] == CLIP)
    return list(clip.get("ct2_ids") or clip["ids"])


def top_two_gap(scores: np.ndarray) -> tuple[int, int, float]:
    order = np.argsort(-scores, kind="stable")[:2]  # (on a tie the lower id first, as greedy's argmax picks)
    return int(order[0]), int(order[1]), float(scores[order[0]] - scores[order[1]])


def top5(scores: np.ndarray) -> list[list[float]]:
    """The five highest (id, value) of masked scores: the values at a near tie."""
    order = np.argsort(-scores, kind="stable")[:5]
    return [[int(i), float(scores[i])] for i in order]


def masked(row: np.ndarray, ref: dict[str, Any], first: bool) -> np.ndarray:
    s = np.array(row, np.float32).copy()
    s[ref["suppress_tokens"]] = -np.inf
    if first:
        s[ref["begin_suppress_tokens"]] = -np.inf
    return s


def loadavg_thread(stop: threading.Event, samples: list[tuple[float, tuple[float, float, float]]]) -> None:
    while not stop.wait(30):
        samples.append((time.time() - T0, os.getloadavg()))
        log("(load sample)")


def run_htp(out: Path, model_name: str) -> None:
    from npurt.speech import Transcriber
    from npurt.speech.audio import load_decoder

    load_decoder()  # libsndfile before the QNN EP (npurt.speech.audio)
    ref = reference(model_name)
    want = ref_ids(model_name)
    result: dict[str, Any] = {"model": model_name, "folder": str(folder(model_name)), "clip": CLIP,
                              "reference_ids": want, "steps": []}
    loads: list[tuple[float, tuple[float, float, float]]] = []
    stop = threading.Event()
    threading.Thread(target=loadavg_thread, args=(stop, loads), daemon=True).start()

    def save() -> None:
        result["load_samples"] = loads
        (out / "htp.json").write_text(json.dumps(result, indent=1, default=str))

    log(f"loading Transcriber({model_name}, QNN, NPU, num_threads=1)")
    t = time.perf_counter()
    tr = Transcriber(folder(model_name), backend="QNN", device="NPU", options={"num_threads": 1})
    result["load_s"] = time.perf_counter() - t
    m = tr.model
    result["static"] = m.static
    result["static_refused"] = m.static_refused
    result["static_verdict"] = m.static_verdict
    result["pinned"] = m.pinned
    log(f"loaded in {result['load_s']:.1f} s: static={m.static} refused={m.static_refused} "
        f"verdict={m.static_verdict}")
    save()

    encode, prefill, step = m.encode, m.prefill, m.step

    def timed_encode(features: np.ndarray) -> np.ndarray:
        np.save(out / "features.npy", np.asarray(features, np.float32))
        log(f"encoder window start: features {features.shape}")
        t0 = time.perf_counter()
        hidden = encode(features)
        result["encoder_s"] = time.perf_counter() - t0
        np.save(out / "hidden_htp.npy", np.asarray(hidden, np.float32))
        log(f"encoder window done in {result['encoder_s']:.1f} s: hidden {hidden.shape}")
        save()
        return hidden

    def timed_prefill(hidden: np.ndarray, prompt: Any) -> Any:
        log(f"prompt run start {list(prompt)}")
        t0 = time.perf_counter()
        logits, cache = prefill(hidden, prompt)
        result["prefill_s"] = time.perf_counter() - t0
        result["cache_static"] = cache.static
        scores = masked(logits[-1], ref, True)
        top = top_two_gap(scores)
        result["steps"].append({"step": 0, "kind": "prompt", "s": result["prefill_s"], "top": top,
                                "top5": top5(scores)})
        log(f"prompt run done in {result['prefill_s']:.1f} s (cache static={cache.static}); masked top two {top}")
        save()
        return logits, cache

    def timed_step(cache: Any, ids: Any) -> np.ndarray:
        n = len(result["steps"])
        t0 = time.perf_counter()
        logits = step(cache, ids)
        dt = time.perf_counter() - t0
        scores = masked(np.asarray(logits)[-1], ref, False)
        top = top_two_gap(scores)
        result["steps"].append({"step": n, "fed": [int(i) for i in ids], "position": getattr(cache, "position", None),
                                "s": dt, "top": top, "top5": top5(scores)})
        log(f"step {n} fed {list(ids)} in {dt:.2f} s; masked top two {top}")
        save()
        return logits

    m.encode, m.prefill, m.step = timed_encode, timed_prefill, timed_step  # type: ignore[method-assign]

    chosen: list[int] = []
    t = time.perf_counter()
    got = tr.transcribe(samples_of(CLIP), sample_rate=16000, on_token=chosen.append,
                        max_new_tokens=ref.get("max_new_tokens"))  # (whisper-random's reference: 20)
    result["transcribe_s"] = time.perf_counter() - t
    result["ids"] = list(got.ids)
    result["text"] = got.text
    result["reference_text"] = tr.text_of(want)
    result["equal"] = list(got.ids) == want
    part = next((k for k, (a, b) in enumerate(zip(got.ids, want, strict=False)) if a != b), None)
    if part is None and len(got.ids) != len(want):
        part = min(len(got.ids), len(want))
    result["first_difference"] = part
    log(f"transcribed in {result['transcribe_s']:.1f} s: ids {list(got.ids)} text {got.text!r}; "
        f"equal to the reference: {result['equal']} (first difference at {part})")
    save()

    result["describe"] = tr.model.describe()
    result["stats"] = {}
    result["placement"] = {}
    for name in ("encoder", "decoder", "decoder_with_past"):
        r = getattr(m, name)
        result["stats"][name] = dict(r.stats) if hasattr(r, "stats") else None
        info = r.device_info
        result["placement"][name] = {"counts": [list(p) for p in info.placement], "attached": str(info.attached),
                                     "load_steps": [list(x) for x in info.load_steps],
                                     "model": str(r.model_path) if hasattr(r, "model_path") else None}
        log(f"{name}: placement {info.placement} attached {info.attached} load_steps {info.load_steps} "
            f"stats {result['stats'][name]}")
        save()
    for name in ("encoder", "decoder", "decoder_with_past"):  # per node (may remake a session to ask the EP why)
        r = getattr(m, name)
        nodes = r.placement
        by = Counter(p.device for p in nodes)
        off = [[p.node, p.op_type, p.device, p.reason] for p in nodes if p.device != "QNNExecutionProvider"]
        result["placement"][name].update({"per_node_counts": dict(by), "not_on_qnn": off})
        log(f"{name}: per-node {dict(by)}; off QNN {off[:10]}")
        save()
    result["batch_checks"] = {str(k): list(v) for k, v in m.batch_checks.items()}
    tr.close()
    stop.set()
    save()
    log("done")


def run_cpu(out: Path, model_name: str) -> None:
    """Plain onnxruntime, CPU EP, 1 thread, fp32: encoder_model.onnx, decoder_model.onnx,
    decoder_with_past_model.onnx (the growing cache), over the features the HTP run got."""
    import onnxruntime as ort

    root = folder(model_name)
    ref = reference(model_name)
    want = ref_ids(model_name)
    htp = json.loads((out / "htp.json").read_text())
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1

    def session(name: str) -> Any:
        return ort.InferenceSession(str(root / name), so, providers=["CPUExecutionProvider"])

    enc, dec, past = session("encoder_model.onnx"), session("decoder_model.onnx"), \
        session("decoder_with_past_model.onnx")
    features = np.load(out / "features.npy")
    t = time.perf_counter()
    hidden_cpu = enc.run(["last_hidden_state"], {"input_features": features})[0]
    enc_s = time.perf_counter() - t
    result: dict[str, Any] = {"ort": ort.__version__, "encoder_s": enc_s, "reference_ids": want,
                              "htp_ids": htp.get("ids")}
    hidden_htp_path = out / "hidden_htp.npy"
    if hidden_htp_path.exists():
        h = np.load(hidden_htp_path)
        a, b = h.ravel().astype(np.float64), hidden_cpu.ravel().astype(np.float64)
        result["hidden_htp_vs_cpu"] = {"max_abs": float(np.max(np.abs(a - b))), "max_abs_cpu": float(np.max(np.abs(b))),
                                       "cosine": float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))}
    dec_out = [o.name for o in dec.get_outputs()]
    past_out = [o.name for o in past.get_outputs()]
    past_in = [i.name for i in past.get_inputs()]

    def decode(hidden: np.ndarray, forced: list[int] | None, limit: int) -> dict[str, Any]:
        """Greedy (forced None) or teacher-forced along ``forced`` (then one more step: the gap after its last)."""
        outs = dict(zip(dec_out, dec.run(dec_out, {"input_ids": np.array([ref["prompt_ids"]], np.int64),
                                                   "encoder_hidden_states": hidden}), strict=True))
        cache = {n.replace("present.", "past_key_values.", 1): v for n, v in outs.items() if n.startswith("present.")}
        scores = masked(outs["logits"][0, -1], ref, True)
        ids: list[int] = []
        steps = []
        while len(steps) < limit:
            top = top_two_gap(scores)
            steps.append({"step": len(steps), "top": top, "top5": top5(scores)})
            if forced is None:
                token = top[0]
                if token == ref["eot_id"]:
                    break
            else:
                if len(ids) == len(forced):
                    break
                token = forced[len(ids)]
            ids.append(token)
            feeds = {"input_ids": np.array([[token]], np.int64), **{k: v for k, v in cache.items() if k in past_in}}
            o = dict(zip(past_out, past.run(past_out, feeds), strict=True))
            for n, v in o.items():
                if n.startswith("present."):
                    cache[n.replace("present.", "past_key_values.", 1)] = v
            scores = masked(o["logits"][0, -1], ref, False)
        return {"ids": ids, "steps": steps}

    limit = ref.get("max_new_tokens") or 100
    result["cpu_greedy"] = decode(hidden_cpu, None, limit)
    result["cpu_greedy_equal_reference"] = result["cpu_greedy"]["ids"] == want
    result["cpu_along_reference"] = decode(hidden_cpu, want, limit)
    if htp.get("ids") is not None:
        result["cpu_along_htp"] = decode(hidden_cpu, list(htp["ids"]), limit)
        if hidden_htp_path.exists():
            result["cpu_decoder_over_htp_encoder_greedy"] = decode(np.load(hidden_htp_path), None, limit)
            result["cpu_decoder_over_htp_encoder_along_htp"] = decode(np.load(hidden_htp_path), list(htp["ids"]), limit)
    (out / "cpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))
    print("cpu greedy ids", result["cpu_greedy"]["ids"], "equal ref", result["cpu_greedy_equal_reference"])
    for k in ("cpu_along_reference", "cpu_along_htp", "cpu_decoder_over_htp_encoder_greedy"):
        if k in result:
            print(k, result[k]["ids"], [round(s["top"][2], 4) for s in result[k]["steps"]])


def main() -> None:
    global LOG
    mode, out = sys.argv[1], Path(sys.argv[2])
    model_name = sys.argv[3] if len(sys.argv) > 3 else "whisper-optimum"
    out.mkdir(parents=True, exist_ok=True)
    LOG = open(out / f"{mode}.log", "a")  # noqa: SIM115
    log(f"{mode} {model_name} pid {os.getpid()} affinity {sorted(os.sched_getaffinity(0))}")
    if mode not in ("htp", "cpu"):
        raise SystemExit(f"tools.htp_whisper: mode 'htp' or 'cpu', got {mode!r} (see the module's docstring)")
    (run_htp if mode == "htp" else run_cpu)(out, model_name)


if __name__ == "__main__":
    main()
