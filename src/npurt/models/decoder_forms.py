"""The test decoders in the forms people download, one entry point:
``python -m npurt.models.decoder_forms OUT --shape NAME [--form FORM] [--precision fp32|fp16|int4] [--seed N]
[--block-size 32|128] [--zero-points] [--accuracy-level 0|4] [--external-data [NAME]]``.

Every form holds the same weights (`decoders.make_weights`, one `DecoderShape` and seed), so that their logits
agree up to the form's own rounding. Forms (FORMS):

- ``standard``: `decoders.build_model` (standard ONNX operators, the cache grown by Concat) with genai_config.json.
- ``builder``: `genai_builder.build_builder_model` (ONNX Runtime GenAI's model builder: GroupQueryAttention with
  the rotary fused, Simplified / SkipSimplified LayerNormalization; genai_config.json with
  ``past_present_share_buffer``); ``builder-packed``: the same with one packed Q/K/V MatMul per layer;
  ``builder-rotary``: the rotary embedding as RotaryEmbedding nodes before the attention, from a ``position_ids``
  input (as the builder writes it where the attention does not fuse it). A builder form may take a sliding window
  (``local_window_size``).
- ``optimum``: the standard graph as optimum exports it: ``model.onnx`` with ``config.json`` and
  ``generation_config.json``, no genai_config.json; ``optimum-merged``: `optimum_forms.build_merged_model`,
  ``decoder_model_merged.onnx`` (an If on ``use_cache_branch``) with the same two configs.

Precisions (`decoder_precision`): ``fp32``; ``fp16`` (weights, activations, past, present and logits);
``int4`` (``MatMulNBits`` by ONNX Runtime's MatMulNBitsQuantizer, settings in `Int4`).

A preset whose name ends in ``-builder`` (``bench-builder``) is built in the builder form unless a form is given.
(This is not ``python -m npurt.models.decoders --form``: decoders.py is the bottom module every form imports.)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import onnx

from .decoder_precision import PRECISIONS, Int4, quantize_int4, to_float16
from .decoders import (
    EOS_TOKEN_ID,
    GENAI_CONFIG,
    MODEL_FILE,
    SHAPES,
    DecoderShape,
    build_model,
    genai_config,
    shape_of,
)
from .genai_builder import build_builder_model, builder_genai_config, save_model
from .optimum_forms import MERGED_MODEL_FILE, build_merged_model, write_hf_configs

FORMS = ("standard", "builder", "builder-packed", "builder-rotary", "optimum", "optimum-merged")
BUILDER_FORMS = ("builder", "builder-packed", "builder-rotary")
GENAI_FORMS = ("standard", *BUILDER_FORMS)  # those written with a genai_config.json


def default_form(shape_name: str) -> str:
    """The form a preset is built in where none is given: ``builder`` for ``*-builder`` presets, else
    ``standard``."""
    return "builder" if shape_name.endswith("-builder") else "standard"


def model_file(form: str) -> str:
    """The model's file name in ``form``: ``decoder_model_merged.onnx`` for optimum's merged decoder, else
    ``model.onnx``."""
    return MERGED_MODEL_FILE if form == "optimum-merged" else MODEL_FILE


def build_form_model(shape: DecoderShape | str, seed: int = 0, *, form: str = "standard", precision: str = "fp32",
                     int4: Int4 | None = None, local_window_size: int = -1) -> onnx.ModelProto:
    """The decoder of ``shape`` in ``form`` (FORMS) and ``precision`` (PRECISIONS; ``int4``: `Int4` settings,
    default block 32, symmetric, accuracy level 0) as an ONNX model, weights inline; ``local_window_size`` (builder
    forms): GroupQueryAttention's sliding window, -1 none."""
    if form not in FORMS:
        raise ValueError(f"no decoder form {form!r}; forms: {', '.join(FORMS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"no precision {precision!r}; precisions: {', '.join(PRECISIONS)}")
    if int4 is not None and precision != "int4":
        raise ValueError(f"int4 settings given for precision {precision!r}")
    shape = shape_of(shape) if isinstance(shape, str) else shape
    if local_window_size != -1 and form not in BUILDER_FORMS:
        raise ValueError(f"local_window_size is GroupQueryAttention's: the {form} form has none")
    if form in BUILDER_FORMS:
        model = build_builder_model(shape, seed, packed_qkv=form == "builder-packed",
                                    rotary_node=form == "builder-rotary", local_window_size=local_window_size)
    elif form == "optimum-merged":
        model = build_merged_model(shape, seed)
    else:
        model = build_model(shape, seed)
    if precision == "fp16":
        return to_float16(model)
    if precision == "int4":
        return quantize_int4(model, int4)
    return model


def build_decoder_form(folder: str | Path, shape: DecoderShape | str, seed: int = 0, *, form: str | None = None,
                       precision: str = "fp32", int4: Int4 | None = None, local_window_size: int = -1,
                       external_data: bool | str = False, eos_token_id: int = EOS_TOKEN_ID) -> Path:
    """Write the decoder of ``shape`` (a DecoderShape or a preset's name) in ``form`` (FORMS; None: the preset's
    `default_form`) and ``precision`` into ``folder`` (made if missing), with the form's configs (genai_config.json,
    or optimum's config.json and generation_config.json); returns the model's path. ``external_data``: the weights
    beside the model, in ``<model file>.data`` (True) or the file named (optimum writes ``model.onnx_data``)."""
    if form is None:
        form = default_form(shape) if isinstance(shape, str) else "standard"
    model = build_form_model(shape, seed, form=form, precision=precision, int4=int4,
                             local_window_size=local_window_size)
    shape = shape_of(shape) if isinstance(shape, str) else shape
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = model_file(form)
    data = f"{name}.data" if external_data is True else (external_data or None)
    path = save_model(model, folder / name, data)
    if form in GENAI_FORMS:
        config = (builder_genai_config(shape, eos_token_id=eos_token_id, position_ids=form == "builder-rotary")
                  if form in BUILDER_FORMS else
                  genai_config(shape, eos_token_id=eos_token_id))
        (folder / GENAI_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    else:
        write_hf_configs(folder, shape, eos_token_id)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npurt.models.decoder_forms", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the folder to write into (made if missing)")
    p.add_argument("--shape", default="gqa", choices=sorted(SHAPES), help="a preset (default gqa)")
    p.add_argument("--form", choices=FORMS, help="the form (default: builder for *-builder presets, else standard)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--block-size", type=int, default=32, help="int4: weights per scale (default 32)")
    p.add_argument("--zero-points", action="store_true", help="int4: a zero point per block (default symmetric)")
    p.add_argument("--accuracy-level", type=int, default=0, help="int4: MatMulNBits' accuracy_level (0 or 1..4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--external-data", metavar="NAME", nargs="?", const=True, default=False,
                   help="the weights as ONNX external data, in NAME (default: the model's file name + .data)")
    args = p.parse_args(argv)
    form = args.form or default_form(args.shape)
    int4 = Int4(args.block_size, not args.zero_points, args.accuracy_level) if args.precision == "int4" else None
    path = build_decoder_form(args.out, args.shape, args.seed, form=form, precision=args.precision, int4=int4,
                              external_data=args.external_data)
    shape = shape_of(args.shape)
    label = int4.label if int4 else args.precision
    print(f"wrote {path} ({form} form, {label}): {args.shape} {asdict(shape)}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
