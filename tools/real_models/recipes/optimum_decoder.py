"""A Hugging Face decoder folder -> optimum's ``text-generation-with-past`` export (model.onnx with the cache as
past_key_values.* / present.*, the folder's tokenizer, chat template and configs), in venv hf4.

The reference is transformers' (the input folder's reference.json, carried over). Checked before the folder is
kept: plain ONNX Runtime over the export, greedy with its cache, gives transformers' ids for every chat, except
from a step where transformers' top two logits are within 0.02 (a near-tie another kernel may order otherwise;
where that happens is written down).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from common import arguments, check, write_reference

NEAR_TIE = 0.02

out, args = arguments()
hf = Path(args["inputs"]["smollm2-hf"])
subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(hf),
                "--task", "text-generation-with-past", str(out)], check=True)
source = json.loads((hf / "reference.json").read_text())
for name in ("chat_template.jinja", "generation_config.json"):
    if (hf / name).is_file() and not (out / name).is_file():
        shutil.copy(hf / name, out / name)

session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
inputs = {i.name: i for i in session.get_inputs()}
names = [o.name for o in session.get_outputs()]
pasts = [n for n in inputs if n.startswith("past_key_values.")]
config = json.loads((hf / "config.json").read_text())
kv_heads, head_dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
chats = []
for chat in source["chats"]:
    ids, total, new = list(chat["prompt_ids"]), len(chat["prompt_ids"]), []
    past = {n: np.zeros((1, kv_heads, 0, head_dim), np.float32) for n in pasts}
    for _ in range(len(chat["ids"])):
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None]
        result = dict(zip(names, session.run(names, feeds)))
        token = int(np.argmax(result["logits"][0, -1]))
        new.append(token)
        past = {n: result[n.replace("past_key_values.", "present.")] for n in pasts}
        ids, total = [token], total + 1
    differ = next((k for k, (a, b) in enumerate(zip(new, chat["ids"])) if a != b), None)
    if differ is not None:
        check(chat["top_two_gaps"][differ] < NEAR_TIE,
              f"optimum's export parts from transformers at step {differ} (top-two gap "
              f"{chat['top_two_gaps'][differ]:.3g})")
    chats.append({**chat, "onnxruntime_ids": new, "parts_at": differ})
write_reference(out, {**source, "chats": chats,
                      "checked": "plain ONNX Runtime greedy over the export against transformers' ids"})
