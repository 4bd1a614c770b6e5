"""`npurt run [MODEL]`: run a model and say what it did, where it ran and how fast.

Without MODEL it runs the embedded digit classifier on its held-out samples and reports what it recognised and its
accuracy; with one it runs the model on ``--input`` arrays (random inputs for the rest: an open batch dim is run
as 1, other open dims need ``--shape``) and summarises the outputs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..modelinfo import ModelDeclaration, concrete_input_shapes
from .common import (
    EXIT_USAGE,
    CliError,
    add_model_options,
    ask_for_shapes,
    create_runner,
    describe_device,
    load_model_file,
    model_label,
    one_line,
    pinned_shapes,
    resolve_backend,
    runner_options,
)

ART_SAMPLES = 4  # default-model samples drawn as text


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="run a model (the embedded digit classifier without MODEL)",
                       description="Run a model (without MODEL: the embedded handwritten-digit classifier on its "
                                   "held-out samples) and show what it did, where it ran and how fast.")
    p.add_argument("model", metavar="MODEL", nargs="?", help="an ONNX or OpenVINO IR model (default: embedded)")
    add_model_options(p, "openvino, vaiml or auto", "auto")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file "
                   "(repeatable); inputs not given are random")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--output", metavar="OUT.npz", help="save the outputs to a .npz file")
    p.add_argument("--repeat", type=int, default=10, metavar="N",
                   help="runs after the first one, for the latency (default: 10)")
    p.add_argument("--tensor-type", choices=("HW", "CPU", "hw", "cpu"), default=None,
                   help="the view the runner's ports take (default: the runner's, HW)")
    p.set_defaults(func=run)


def parse_inputs(items: Sequence[str] | None, model: ModelDeclaration) -> dict[str, tuple[np.ndarray, str]]:
    """--input NAME=file.npy, checked against the model's inputs (name, rank and declared dims, dtype):
    {name: (array, file)}."""
    arrays: dict[str, tuple[np.ndarray, str]] = {}
    for item in items or ():
        name, sep, file = item.rpartition("=")
        if not sep or not name or not file:
            raise CliError(f"--input {item!r}: expected NAME=file.npy", EXIT_USAGE)
        port = model.input(name)
        if port is None:
            raise CliError(f"--input {item}: the model has no input {name!r} (its inputs: "
                           f"{', '.join(p.name for p in model.inputs)})", EXIT_USAGE)
        if name in arrays:
            raise CliError(f"--input: input {name!r} is given twice", EXIT_USAGE)
        path = Path(file)
        if not path.is_file():
            raise CliError(f"--input {item}: file not found: {path}")
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            raise CliError(f"--input {item}: {path} is not a .npy file (save the array with numpy.save)")
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001
            raise CliError(f"--input {item}: {path} is not a readable .npy array ({one_line(e)})") from None
        if port.dtype != str(arr.dtype):
            raise CliError(f"--input {item}: dtype {arr.dtype}, expected {port.dtype} for input {name!r} (convert it "
                           f"with arr.astype(np.{port.dtype}))")
        if not port.fits(arr.shape):
            raise CliError(f"--input {item}: shape {list(arr.shape)}, expected {port.shape_text()} for input "
                           f"{name!r}")
        arrays[name] = (arr, file)
    return arrays


def summarize_output(name: str, arr: np.ndarray) -> str:
    text = f"  {name:<12} {list(arr.shape)} {arr.dtype}"
    if arr.size == 0:
        return text + "  (empty)"
    if np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_:
        a = arr.astype(np.float64)
        text += f"  min {a.min():.6g}  max {a.max():.6g}  mean {a.mean():.6g}"
        scores = arr.reshape(-1) if arr.ndim == 1 or (arr.ndim == 2 and arr.shape[0] == 1) else None
        if scores is not None and scores.size > 1 and np.issubdtype(arr.dtype, np.floating):
            best = int(np.argmax(scores))
            text += f"  argmax {best} ({float(scores[best]):.6g})"
        elif arr.ndim == 2 and arr.shape[1] > 1 and np.issubdtype(arr.dtype, np.floating):
            text += f"  argmax per row {np.argmax(arr, axis=1).tolist()[:16]}"
    return text


def _digits_report(images: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> list[str]:
    """What the default model read: a few samples drawn as text with its answer under each, and its accuracy."""
    from ..models import ascii_art

    read = np.argmax(scores, axis=1)
    shown = min(ART_SAMPLES, len(images))
    width = 2 * images.shape[-1] + 2  # ascii_art: two characters per pixel, two spaces apart
    art = ascii_art(*images[:shown]).splitlines()
    art.append("".join(f"read {read[i]} ({scores[i, read[i]]:.2f})".ljust(width) for i in range(shown)).rstrip())
    right = int((read == labels).sum())
    mistakes = [f"sample {i}: read {read[i]}, is {labels[i]}" for i in np.flatnonzero(read != labels)]
    result = (f"recognised {right} of {len(labels)} ({100 * right / len(labels):.1f} %); mistakes: "
              + ("; ".join(mistakes) if mistakes else "none"))
    return ["          " + ln if ln else "" for ln in art] + [f"Result    {result}"]


def _random_frames(name: str, spec: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random uint8 frames for a frame input (option frames): its frame_size, else its model_size, else 480x640."""
    h, w = spec.get("frame_size") or spec.get("model_size") or (480, 640)
    if spec["format"].upper() == "NV12":
        h, w = h + h % 2, w + w % 2
        return {f"{name}/y": rng.integers(0, 256, (1, h, w, 1), np.uint8),
                f"{name}/uv": rng.integers(0, 256, (1, h // 2, w // 2, 2), np.uint8)}
    return {name: rng.integers(0, 256, (1, h, w, 1 if spec["format"].upper() == "GRAY" else 3), np.uint8)}


def run(args: argparse.Namespace) -> int:
    from ..bench import Budget, CallSubject, measure_latency, stopwatch
    from ..models import default_model_path, default_samples

    embedded = args.model is None
    backend = resolve_backend(args.backend)  # first: an unknown backend is the error to give, whatever else is wrong
    path = default_model_path() if embedded else Path(args.model)
    model = load_model_file(path)
    shapes = pinned_shapes(args, model)
    given = parse_inputs(args.input, model)
    for name, (arr, _) in given.items():
        if name in shapes and tuple(arr.shape) != shapes[name]:
            raise CliError(f"--input {name}=...: shape {list(arr.shape)} differs from --shape "
                           f"{name}={','.join(map(str, shapes[name]))}", EXIT_USAGE)
    if args.repeat < 0:
        raise CliError(f"--repeat {args.repeat}: must be 0 or more", EXIT_USAGE)
    samples = default_samples() if embedded and not given else None
    feeds: dict[str, np.ndarray] = {}
    sources: list[str] = []
    if samples is not None:
        feeds[model.inputs[0].name] = samples[0]
        sources.append(f"{model.inputs[0].name} {list(samples[0].shape)} {samples[0].dtype}: {len(samples[1])} "
                       "held-out digits it never saw in training (npurt.models.default_samples)")
    else:
        framed = runner_options(args, {}).get("frames", {})
        frame_shapes = {n: (1, 1, 1, 1) for n in framed}  # the model's own shape is not what a frame input takes
        choice = concrete_input_shapes(model, {**shapes, **frame_shapes, **{n: a.shape for n, (a, _) in given.items()}})
        if choice.unresolved:
            raise ask_for_shapes(choice.unresolved, "run")
        rng = np.random.default_rng(args.seed)
        from ..bench import random_array

        for port in model.inputs:
            if port.name in framed:
                for name, frame in _random_frames(port.name, framed[port.name], rng).items():
                    feeds[name] = frame
                    sources.append(f"{name} {list(frame.shape)} uint8 random frame (seed {args.seed})")
            elif port.name in given:
                arr, file = given[port.name]
                feeds[port.name] = arr
                sources.append(f"{port.name} {list(arr.shape)} {arr.dtype} from {file}")
            else:
                shape = choice.shapes[port.name]
                feeds[port.name] = random_array(shape, port.dtype, rng)
                picked = " (the open batch dim run as 1)" if port.name in choice.picked else ""
                sources.append(f"{port.name} {list(shape)} {port.dtype} random (seed {args.seed}){picked}")
    if args.output is not None and not Path(args.output).resolve().parent.is_dir():
        raise CliError(f"--output {args.output}: directory {Path(args.output).resolve().parent} does not exist")
    options = runner_options(args, shapes)
    if args.tensor_type:
        options["input_tensor_type"] = options["output_tensor_type"] = args.tensor_type.upper()
    loaded = create_runner(backend, path, options)
    runner = loaded.runner
    try:
        try:
            results, first_ms = stopwatch(lambda: runner.run(feeds))
            latency = measure_latency([CallSubject("run", lambda: runner.run(feeds))],
                                      Budget(niter=args.repeat, time_s=None, warmup=0, blocks=1, settle=0)
                                      )[0] if args.repeat else None
        except ValueError as e:
            raise CliError(one_line(e), EXIT_USAGE) from e
        out = [f"Model     {model_label(path, embedded)}", f"Backend   {loaded.backend}"]
        out += [f"          {n}" for n in loaded.notes]
        out.append("Device    " + "\n          ".join(describe_device(runner)))
        out.append("Inputs    " + "\n          ".join(sources))
        if samples is not None:
            out += _digits_report(samples[0], samples[1], next(iter(results.values())))
        else:
            out.append("Outputs")
            out += [summarize_output(name, arr) for name, arr in results.items()]
        lat = f"load + compile {loaded.load_ms:.0f} ms, first inference {first_ms:.2f} ms"
        if latency is not None:
            batch = len(samples[1]) if samples is not None else 0
            per = (f" per batch of {batch} ({latency.p50_ms * 1e3 / batch:.1f} us per digit)" if batch else
                   f" (min {latency.min_ms:.3f}, max {latency.max_ms:.3f})")
            lat += f", then p50 {latency.p50_ms:.3f} ms{per} over {latency.count} runs"
        out.append(f"Latency   {lat}")
        if args.output is not None:
            np.savez(args.output, **results)
            out.append(f"Saved     {', '.join(results)} to {args.output}")
    finally:
        runner.close()
    print("\n".join(out))
    return 0
