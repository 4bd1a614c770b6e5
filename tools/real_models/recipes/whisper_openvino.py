"""whisper-hf -> optimum-intel's OpenVINO IR (``optimum-cli export openvino --task
automatic-speech-recognition-with-past --weight-format fp32``), as optimum-intel writes it, in venv openvino: the
folder OpenVINO GenAI's ``WhisperPipeline`` takes (benchmarks/speech.py's ``openvino-genai`` side).

The product (``whisper-openvino``)::

    openvino_encoder_model.xml/.bin   input_features -> last_hidden_state
    openvino_decoder_model.xml/.bin   the stateful decoder: its self- and cross-attention caches are the compiled
                                      model's variables, reordered by input ``beam_idx``
    openvino_tokenizer.xml/.bin, openvino_detokenizer.xml/.bin   openvino-tokenizers' conversion of tokenizer.json
                                      (WhisperPipeline decodes its ids with the detokenizer)
    config.json, generation_config.json, preprocessor_config.json, tokenizer files   (whisper-hf's, as optimum-intel
                                      copies them)
    reference.json                    (below)

reference.json::

    "clips": [{"clip", "file", "genai_text": WhisperPipeline's text (greedy, no timestamps, the folder's generation
               config), "ct2_ids", "ct2_text": CTranslate2's (whisper-optimum's reference.json, carried over)}]
    "checked": what was checked

Checked before the folder is kept: WhisperPipeline(folder, "CPU") at f32 (inference and cache, as
benchmarks/speech.py runs it)'s text equals CTranslate2's text (surrounding blanks aside: WhisperPipeline keeps the
leading space of the first token) on every utterance of speech-clips. At the plug-in's defaults it infers in bf16 on a
CPU with AMX / AVX-512 BF16 (and keeps its cache in the IR's f16 or u8): there "fox" read "roundfark" for CTranslate2's
"round-fark", a near-tie, not the IR's fault.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openvino_genai
from common import arguments, check, write_reference
from whisper_common import clips

WRITTEN = ("openvino_encoder_model.xml", "openvino_decoder_model.xml", "openvino_tokenizer.xml",
           "openvino_detokenizer.xml")

out, args = arguments()
source = Path(args["inputs"]["whisper-hf"])
subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(source),
                "--task", "automatic-speech-recognition-with-past", "--weight-format", "fp32", str(out)], check=True)
if not (out / "openvino_detokenizer.xml").is_file():  # optimum-intel converts the tokenizer where it can; else here
    subprocess.run([sys.executable, "-m", "openvino_tokenizers.cli", str(source), "--with-detokenizer", "-o",
                    str(out)], check=True)
for name in WRITTEN:
    check((out / name).is_file(), f"optimum-intel wrote {name}")

ct2 = json.loads((Path(args["inputs"]["whisper-optimum"]) / "reference.json").read_text())
expected = {c["clip"]: c for c in ct2["clips"]}
pipeline = openvino_genai.WhisperPipeline(str(out), "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
entries = []
for clip in clips(args["inputs"]["speech-clips"]):
    if clip["kind"] == "passage":
        continue
    text = str(pipeline.generate(clip["samples"], return_timestamps=False).texts[0])
    want = expected[clip["name"]]
    check(text.strip() == want["ct2_text"].strip(),
          f"{clip['name']}: WhisperPipeline's text {text!r} equals CTranslate2's {want['ct2_text']!r}")
    entries.append({"clip": clip["name"], "file": clip["file"], "genai_text": text, "ct2_ids": want["ct2_ids"],
                    "ct2_text": want["ct2_text"]})
check(len(entries) == len(expected), f"every utterance of whisper-optimum's reference checked ({len(entries)})")
write_reference(out, {
    "reference": f"OpenVINO GenAI {openvino_genai.__version__} WhisperPipeline on CPU at f32 (greedy, no timestamps) "
                 "over optimum-intel 2.2.0's fp32 IR; CTranslate2's ids and text from whisper-optimum",
    "clips": entries,
    "checked": "WhisperPipeline's text equals CTranslate2's text (stripped) on every utterance"})
