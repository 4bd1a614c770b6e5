"""smollm2-hf -> optimum-intel's OpenVINO IR (``optimum-cli export openvino --task text-generation-with-past
--weight-format fp32``), as optimum-intel writes it, in venv openvino: the folder OpenVINO GenAI's ``LLMPipeline``
takes (benchmarks/real_chat.py's ``--openvino-genai`` side, against npurt's OPENVINO backend over the builder's fp32
folder of the same weights).

The product (``smollm2-openvino``): openvino_model.xml/.bin (the stateful decoder: its cache in the compiled model's
variables), openvino_tokenizer / openvino_detokenizer, the folder's configs, tokenizer files and chat template, and
reference.json: transformers' chats (smollm2-hf's, carried over) with ``genai_ids``, LLMPipeline's greedy ids at f32.

Checked before the folder is kept: LLMPipeline's greedy ids at f32 equal transformers' on every chat, except from a
step where transformers' top two logits are within 0.02 (a near-tie another engine's kernels may order otherwise;
where that happens is written down).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai
from common import arguments, check, write_reference

NEAR_TIE = 0.02

out, args = arguments()
hf = Path(args["inputs"]["smollm2-hf"])
subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(hf),
                "--task", "text-generation-with-past", "--weight-format", "fp32", str(out)], check=True)
for name in ("chat_template.jinja", "generation_config.json"):
    if (hf / name).is_file() and not (out / name).is_file():
        shutil.copy(hf / name, out / name)
check((out / "openvino_model.xml").is_file(), "optimum-intel wrote openvino_model.xml")

source = json.loads((hf / "reference.json").read_text())
pipe = openvino_genai.LLMPipeline(str(out), "CPU", INFERENCE_PRECISION_HINT="f32")
chats = []
for chat in source["chats"]:
    config = pipe.get_generation_config()  # (the folder's: its eos ids; transformers' ids stop at the eos too)
    config.max_new_tokens = len(chat["ids"])
    config.do_sample = False
    result = pipe.generate(ov.Tensor(np.array([chat["prompt_ids"]], np.int64)), config)
    got = [int(t) for t in np.asarray(result.tokens[0]).ravel()][:len(chat["ids"])]
    want = chat["ids"]
    if len(got) == len(want) - 1 and want[-1] == source["eos_token_id"]:  # (LLMPipeline leaves its eos out)
        got.append(want[-1])
    differ = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if differ is None and len(got) != len(want):  # (one stopped first: where the other went on)
        differ = min(len(got), len(want))
    if differ is not None:
        check(chat["top_two_gaps"][differ] < NEAR_TIE,
              f"LLMPipeline parts from transformers at step {differ} (top-two gap "
              f"{chat['top_two_gaps'][differ]:.3g})")
    chats.append({**chat, "genai_ids": got, "parts_at": differ})
write_reference(out, {**source, "chats": chats,
                      "reference": f"{source['reference']}; OpenVINO GenAI {openvino_genai.__version__} LLMPipeline "
                                   "on CPU at f32 over optimum-intel 2.2.0's fp32 IR",
                      "checked": "LLMPipeline's greedy ids at f32 against transformers' (up to a near-tie)"})
