"""A tiny random-weight Whisper in optimum's forms, for fast tests, in venv encoders.

tiny.en's vocabulary, tokenizer, feature extractor and generation config (whisper-hf's), with a small seeded random
model: d_model 64, 2 encoder and 2 decoder layers, 4 heads, ffn 128, 80 mels, 1500 source / 448 target positions
(``CONFIG``). The initialiser's std is 0.2 (transformers' 0.02 leaves logits so flat that top-two gaps fall near
float32 noise). alignment_heads are the last half of the decoder's layers, every head (ctranslate2's default).

The product (``whisper-random``): the same files as whisper-optimum (encoder_model.onnx, decoder_model.onnx,
decoder_with_past_model.onnx, decoder_model_merged.onnx, config.json, generation_config.json,
preprocessor_config.json, the tokenizer files), and reference.json::

    "prompt_ids": [50257, 50362], "eot_id": 50256, "eot_included": false, "max_new_tokens": 20,
    "suppress_tokens", "begin_suppress_tokens": the generation config's
    "clips": [{"clip", "file" (in speech-clips), "ids": transformers' greedy ids (at most 20 new tokens, the
               generation config's suppression), "gaps": each step's top-two gap of ONNX Runtime's masked logits}]
    "seed", "config": CONFIG, "checked"

Checked before the folder is kept: plain ONNX Runtime's greedy ids (merged decoder, and decoder + with-past) equal
transformers' on both clips.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch
from common import arguments, check, write_reference
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizerFast,
)
from whisper_common import EOT, PROMPT, clips, features, hf_greedy
from whisper_onnx import ort_greedy

SEED = 0
MAX_NEW_TOKENS = 20
CLIPS = ("fox", "question")
CONFIG = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
          "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "init_std": 0.2}

out, args = arguments()
real = Path(args["inputs"]["whisper-hf"])
source = Path(out).parent / f"{Path(out).name}.source"  # the random model's torch folder (outside the product)
shutil.rmtree(source, ignore_errors=True)
config = WhisperConfig.from_pretrained(real)
for key, value in CONFIG.items():
    setattr(config, key, value)
torch.manual_seed(SEED)
model = WhisperForConditionalGeneration(config).eval()
generation = GenerationConfig.from_pretrained(real)
layers, heads = config.decoder_layers, config.decoder_attention_heads
generation.alignment_heads = [[layer, head] for layer in range(layers // 2, layers) for head in range(heads)]
model.generation_config = generation
model.save_pretrained(source)
WhisperTokenizerFast.from_pretrained(real).save_pretrained(source)
WhisperFeatureExtractor.from_pretrained(real).save_pretrained(source)
shutil.copyfile(real / "tokenizer.json", source / "tokenizer.json")
subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(source),
                "--task", "automatic-speech-recognition-with-past", str(out)], check=True)

model = WhisperForConditionalGeneration.from_pretrained(source).eval()
shutil.rmtree(source, ignore_errors=True)
extractor = WhisperFeatureExtractor.from_pretrained(out)
suppress, begin_suppress = list(generation.suppress_tokens), list(generation.begin_suppress_tokens)
entries = []
for clip in clips(args["inputs"]["speech-clips"]):
    if clip["name"] not in CLIPS:
        continue
    feats = features(extractor, clip["samples"])
    want, _ = hf_greedy(model, feats, max_new_tokens=MAX_NEW_TOKENS)
    for merged in (True, False):
        got, gaps = ort_greedy(out, feats, suppress, begin_suppress, merged=merged, max_new_tokens=MAX_NEW_TOKENS)
        check(got == want, f"{clip['name']}: ONNX Runtime's greedy ids (merged {merged}) {got} equal "
                           f"transformers' {want}")
        if merged:
            entries.append({"clip": clip["name"], "file": clip["file"], "ids": want, "gaps": gaps})
check(len(entries) == len(CLIPS), f"clips {CLIPS} found")
write_reference(out, {
    "reference": "transformers 4.57.6 (torch 2.13.0 CPU, fp32) greedy; ONNX Runtime 1.32.0 for gaps",
    "prompt_ids": PROMPT, "eot_id": EOT, "eot_included": False, "max_new_tokens": MAX_NEW_TOKENS,
    "suppress_tokens": suppress, "begin_suppress_tokens": begin_suppress, "clips": entries, "seed": SEED,
    "config": CONFIG,
    "checked": "plain ONNX Runtime greedy (merged decoder, and decoder + with-past) equals transformers' on every "
               "clip"})
