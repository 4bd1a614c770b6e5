"""The test decoders in the forms people download, one entry point:
``python -m npurt.models.decoder_forms OUT --shape NAME [--form FORM] [--seed N] [--external-data NAME]``.

Every form holds the same weights (`decoders.make_weights`, one `DecoderShape` and seed), so that their logits
agree up to the form's own rounding:

- ``standard``: `decoders.build_decoder` (standard ONNX operators, the cache grown by Concat, optimum's layout).
- ``builder``: `genai_builder.build_builder_decoder` (ONNX Runtime GenAI's model builder: GroupQueryAttention with
  the rotary fused, Simplified / SkipSimplified LayerNormalization, ``past_present_share_buffer``).
- ``builder-packed``: the builder form with one packed Q/K/V MatMul per layer.

A preset whose name ends in ``-builder`` (``bench-builder``) is built in the builder form unless a form is given.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from .decoders import (
    EOS_TOKEN_ID,
    EXTERNAL_DATA_FILE,
    MODEL_FILE,
    SHAPES,
    DecoderShape,
    build_decoder,
    build_model,
    shape_of,
    write_genai_config,
)
from .genai_builder import build_builder_decoder, save_model

FORMS = ("standard", "builder", "builder-packed")
BUILDER_FORMS = ("builder", "builder-packed")


def default_form(shape_name: str) -> str:
    """The form a preset is built in where none is given: ``builder`` for ``*-builder`` presets, else
    ``standard``."""
    return "builder" if shape_name.endswith("-builder") else "standard"


def build_decoder_form(folder: str | Path, shape: DecoderShape | str, seed: int = 0, *, form: str | None = None,
                       external_data: bool | str = False, eos_token_id: int = EOS_TOKEN_ID) -> Path:
    """Write the decoder of ``shape`` (a DecoderShape or a preset's name) in ``form`` (one of FORMS; None: the
    preset's `default_form`) into ``folder``, with its genai_config.json; returns the model's path.
    ``external_data``: True (``model.onnx.data``) or the data file's name (optimum writes ``model.onnx_data``)."""
    if form is None:
        form = default_form(shape) if isinstance(shape, str) else "standard"
    if form not in FORMS:
        raise ValueError(f"no decoder form {form!r}; forms: {', '.join(FORMS)}")
    shape = shape_of(shape) if isinstance(shape, str) else shape
    if form == "standard":
        if not isinstance(external_data, str):
            return build_decoder(folder, shape, seed, external_data=external_data, eos_token_id=eos_token_id)
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_genai_config(folder, shape, eos_token_id=eos_token_id)
        return save_model(build_model(shape, seed), folder / MODEL_FILE, external_data)
    return build_builder_decoder(folder, shape, seed, packed_qkv=form == "builder-packed",
                                 external_data=external_data, eos_token_id=eos_token_id)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npurt.models.decoder_forms", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the folder to write into (made if missing)")
    p.add_argument("--shape", default="gqa", choices=sorted(SHAPES), help="a preset (default gqa)")
    p.add_argument("--form", choices=FORMS, help="the form (default: builder for *-builder presets, else standard)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--external-data", metavar="NAME", nargs="?", const=True, default=False,
                   help=f"the weights as ONNX external data, in NAME (default {EXTERNAL_DATA_FILE})")
    args = p.parse_args(argv)
    form = args.form or default_form(args.shape)
    path = build_decoder_form(args.out, args.shape, args.seed, form=form, external_data=args.external_data)
    shape = shape_of(args.shape)
    print(f"wrote {path} ({form} form): {args.shape} {asdict(shape)}, "
          f"{shape.parameters * 4 / 1e6:.1f} MB of float32 weights, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
