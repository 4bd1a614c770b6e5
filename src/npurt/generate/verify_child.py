"""Run in a child process by ``verify`` (``python verify_child.py JSON``; it imports no npurt, so that the export's
weights never join the runner's process): the export and its derived form fed the same ids, their logits compared.

The reference is plain ONNX Runtime (CPU provider) over the export, its cache growing run by run, the greedy id of
each run fed to the next. The derived form runs on the engine the runner uses:

- ``onnxruntime``: the static form's ONNX file on the CPU provider, each past and its present bound to one buffer
  of max_length rows (an OrtValue bound as both, as the runner binds them), in two ways on fresh caches: the prompt
  in one run, then in chunks laid as a runner with pinned shapes lays them (the last chunk ending at the prompt's
  end over rows already there);
- ``openvino``: the stateful IR on OpenVINO's CPU plugin at f32, the cache in the infer request's state: the prompt
  in one run, then (state reset) in consecutive chunks.

Each way then takes the same steps. The batch form (``batch`` > 1) is checked besides with rows batched, each row
against the export run alone (``_batched``). Prints one JSON object: ``ok``, ``where`` (the first run past the
tolerance, else the one that came closest), ``max_diff`` (the largest difference) and ``tolerance`` (the given
tolerance x the reference logits' largest magnitude, at least 1).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

Run = Callable[[list[int], int], np.ndarray]  # (ids, position) -> the last row's logits


def _reference(export: str, prompt: list[int], steps: int, kv_heads: int, head_dim: int, prepack: bool
               ) -> tuple[list[int], list[np.ndarray]]:
    """The export's greedy ids after the prompt, and the logits each run ended with (its cache [1, kv_heads, rows,
    head_dim]: the export may name those dims)."""
    import onnxruntime as ort

    session = ort.InferenceSession(export, _options(prepack), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    past = {name: np.zeros((1, kv_heads, 0, head_dim), _dtype(i.type))
            for name, i in inputs.items() if name.startswith("past_key_values.")}
    ids, total = list(prompt), len(prompt)
    fed, rows = [], []
    for _ in range(steps + 1):
        feeds: dict[str, Any] = {"input_ids": np.array([ids], np.int64),
                                 "attention_mask": np.ones((1, total), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None]
        if "use_cache_branch" in inputs:  # optimum's merged decoder: the with-past branch once there is a past
            feeds["use_cache_branch"] = np.array([total > len(ids)])
        out = dict(zip(names, session.run(names, feeds)))
        row = np.asarray(out["logits"][0, -1], np.float64)
        rows.append(row)
        token = int(np.argmax(row))
        fed.append(token)
        past = {name: out[name.replace("past_key_values.", "present.")] for name in past}
        ids, total = [token], total + 1
    return fed[:-1], rows


def _dtype(onnx_type: str) -> Any:
    return {"tensor(float)": np.float32, "tensor(float16)": np.float16}.get(onnx_type, np.float32)


def _options(prepack: bool) -> Any:
    """Sessions without weight prepacking where the export has no int4 MatMulNBits: a check's few runs do not repay
    it (a 540 MB fp32 export's session in 0.56 s against 1.46 s, measured), and it holds a second copy of each MatMul's
    weights. MatMulNBits without its prepacked weights dequantizes them every run (a 37-id run of SmolLM2's int4 in
    1.06 s against 0.21 s): there it stays on."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def _onnxruntime(derived: str, max_length: int, prepack: bool) -> Callable[[], Run]:
    import onnxruntime as ort

    session = ort.InferenceSession(derived, _options(prepack), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}

    def fresh() -> Run:
        binding = session.io_binding()
        caches = []
        for name, info in inputs.items():
            if name.startswith("past_key_values."):
                cache = ort.OrtValue.ortvalue_from_numpy(
                    np.zeros((1, int(info.shape[1]), max_length, int(info.shape[3])), _dtype(info.type)))
                caches.append(cache)
                binding.bind_ortvalue_input(name, cache)
                binding.bind_ortvalue_output(name.replace("past_key_values.", "present."), cache)
        binding.bind_output("logits")

        def run(ids: list[int], position: int) -> np.ndarray:
            binding.bind_cpu_input("input_ids", np.array([ids], np.int64))
            binding.bind_cpu_input("position", np.array([position], np.int64))
            session.run_with_iobinding(binding)
            return np.asarray(binding.copy_outputs_to_cpu()[-1][0, -1], np.float64)
        run.caches = caches  # type: ignore[attr-defined]  # (kept alive with the binding)
        return run
    return fresh


def _batched(export: str, derived: str, max_length: int, prompt: list[int], steps: int, rows: int, pad: int,
             vocab: int, prepack: bool) -> list[tuple[str, float, float]]:
    """The batch form (``rows`` rows): each row but the last a sequence of its own (prompts of other ids and
    lengths, so other positions), prefilled alone in its row of one pooled cache (a run of one row bound to that
    row's memory), then ``steps`` steps of all rows at once, the last row idle (a pad id at position 0). Each
    active row's logits against the export run on that sequence alone: (where, difference, reference scale)."""
    import onnxruntime as ort

    session = ort.InferenceSession(derived, _options(prepack), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    pasts = [name for name in inputs if name.startswith("past_key_values.")]
    pool = {name: np.zeros((rows, int(inputs[name].shape[1]), max_length, int(inputs[name].shape[3])),
                           _dtype(inputs[name].type)) for name in pasts}

    def bound(lo: int, hi: int) -> Any:
        binding = session.io_binding()
        for name in pasts:
            view = ort.OrtValue.ortvalue_from_numpy(pool[name][lo:hi])  # (the pool's own memory, not a copy)
            binding.bind_ortvalue_input(name, view)
            binding.bind_ortvalue_output(name.replace("past_key_values.", "present."), view)
        binding.bind_output("logits")
        return binding

    def run(binding: Any, ids: list[list[int]], positions: list[int]) -> np.ndarray:
        binding.bind_cpu_input("input_ids", np.array(ids, np.int64))
        binding.bind_cpu_input("position", np.array(positions, np.int64))
        session.run_with_iobinding(binding)
        return np.asarray(binding.copy_outputs_to_cpu()[-1][:, -1], np.float64)

    active = max(1, rows - 1) if rows > 1 else 1
    prompts = [[(7 * i + 3 + 11 * r) % vocab for i in range(max(1, len(prompt) - 2 * r))] for r in range(active)]
    results: list[tuple[str, float, float]] = []
    kv_heads, head_dim = pool[pasts[0]].shape[1], pool[pasts[0]].shape[3]
    refs = [_reference(export, p, steps, kv_heads, head_dim, prepack) for p in prompts]
    for r, (p, (_, alone)) in enumerate(zip(prompts, refs)):
        got = run(bound(r, r + 1), [p], [0])[0]
        results.append((f"row {r}'s prompt alone in its row", float(np.abs(got - alone[0]).max()),
                        float(np.abs(alone[0]).max())))
    everything = bound(0, rows)
    for k in range(steps):
        ids = [[refs[r][0][k]] if r < active else [pad] for r in range(rows)]
        positions = [len(prompts[r]) + k if r < active else 0 for r in range(rows)]
        got_rows = run(everything, ids, positions)
        for r in range(active):
            expected = refs[r][1][k + 1]
            results.append((f"batched step {k} of {rows} rows: row {r} (position {positions[r]})",
                            float(np.abs(got_rows[r] - expected).max()), float(np.abs(expected).max())))
    return results


def _openvino(derived: str, engine_options: dict[str, Any]) -> Callable[[], Run]:
    import openvino as ov

    compiled = ov.Core().compile_model(derived, "CPU", {**engine_options, "INFERENCE_PRECISION_HINT": "f32"})

    def fresh() -> Run:
        request = compiled.create_infer_request()

        def run(ids: list[int], position: int) -> np.ndarray:
            request.infer({"input_ids": np.array([ids], np.int64), "position": np.array([position], np.int64)})
            return np.asarray(request.get_tensor("logits").data[0, -1], np.float64)
        return run
    return fresh


def _pinned_chunks(sequence: list[int], chunk: int, run: Run, pad: int) -> np.ndarray:
    """The prompt as a runner with pinned shapes lays it (generator.Generator._feed)."""
    total, at = len(sequence), 0
    row = np.empty(0)
    while total - at > 1:
        if total - at < chunk:
            at = total - chunk
            if at < 0:
                run(sequence[:total - 1] + [pad] * (chunk - total + 1), 0)
                at = total - 1
                break
        row = run(sequence[at:at + chunk], at)
        at += chunk
    if at < total:
        row = run(sequence[at:], at)
    return row


def _consecutive_chunks(sequence: list[int], chunk: int, run: Run, pad: int) -> np.ndarray:
    row = np.empty(0)
    for at in range(0, len(sequence), chunk):
        row = run(sequence[at:at + chunk], at)
    return row


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    prompt, steps, chunk = args["prompt"], args["steps"], args["chunk"]
    prepack = bool(args.get("prepack", True))
    fed, want = _reference(args["export"], prompt, steps, args["kv_heads"], args["head_dim"], prepack)
    batched = (_batched(args["export"], args["derived"], args["max_length"], prompt, steps, args["batch"],
                        args["pad"], int(want[0].shape[0]), prepack) if args.get("batch", 1) > 1 else [])
    scale = max(1.0, max(float(np.abs(r).max()) for r in want), *(s for _, _, s in batched))
    tolerance = args["tolerance"] * scale
    if args["engine"] == "openvino":
        fresh, chunked = _openvino(args["derived"], args["engine_options"]), _consecutive_chunks
    else:
        fresh, chunked = _onnxruntime(args["derived"], args["max_length"], prepack), _pinned_chunks
    # the largest difference, and where the first one past the tolerance was (else where the largest was)
    worst: dict[str, Any] = {"ok": True, "where": "", "max_diff": 0.0, "tolerance": tolerance}
    ways: list[tuple[str, Callable[[Run], np.ndarray]]] = [
        ("the prompt in one run", lambda run: run(prompt, 0)),
        (f"the prompt in chunks of {chunk}", lambda run: chunked(prompt, chunk, run, args["pad"]))]
    for way, prefill in ways:
        run = fresh()
        rows = [prefill(run)]
        rows += [run([token], len(prompt) + k) for k, token in enumerate(fed)]
        for k, (got, ref) in enumerate(zip(rows, want)):
            diff = float(np.abs(got - ref).max())
            diff = diff if np.isfinite(diff) else float("inf")
            at = f"step {k} (position {len(prompt) + k - 1})" if k else "the prompt's last row"
            if worst["ok"] and (diff > tolerance or diff > worst["max_diff"]):
                worst["where"] = f"{way}: {at}"
                worst["ok"] = diff <= tolerance
            worst["max_diff"] = max(worst["max_diff"], diff)
    for where, diff, _ in batched:
        diff = diff if np.isfinite(diff) else float("inf")
        if worst["ok"] and (diff > tolerance or diff > worst["max_diff"]):
            worst["where"] = where
            worst["ok"] = diff <= tolerance
        worst["max_diff"] = max(worst["max_diff"], diff)
    print(json.dumps(worst))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
