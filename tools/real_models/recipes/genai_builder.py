"""A Hugging Face decoder folder -> ONNX Runtime GenAI's model builder folder (fp32 or int4, CPU), as the builder
writes it (nothing edited after it), in venv genai.

The reference: onnxruntime-genai's greedy ids for each chat of the input folder's reference.json (the same prompt
ids), stopping at eos as its generator does. Checked before the folder is kept: onnxruntime-genai's tokenizer encodes
each prompt as transformers did; at fp32 its ids begin as transformers' do (the first 8 of every chat) and the
first chat is answered right; int4 answers the first chat right.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import onnxruntime_genai as og
from common import arguments, check, write_reference

out, args = arguments()
hf = args["inputs"]["smollm2-hf"]
precision = args["args"]["precision"]
with tempfile.TemporaryDirectory() as cache:
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", str(out), "-p", precision,
                    "-e", "cpu", "-c", cache], check=True)

source = json.loads(open(f"{hf}/reference.json").read())
model = og.Model(str(out))
tokenizer = og.Tokenizer(model)
answers = []
for chat in source["chats"]:
    encoded = [int(t) for t in tokenizer.encode(chat["prompt"])]
    check(encoded == chat["prompt_ids"], f"onnxruntime-genai's tokenizer encodes {chat['prompt']!r} as transformers")
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(chat["prompt_ids"]) + source["max_new_tokens"])
    generator = og.Generator(model, params)
    generator.append_tokens(chat["prompt_ids"])
    new: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        new.append(int(generator.get_next_tokens()[0]))
    answers.append({**{k: chat[k] for k in ("messages", "prompt", "prompt_ids")}, "ids": new,
                    "text": tokenizer.decode(new), "transformers_ids": chat["ids"]})
check("Paris" in answers[0]["text"], f"first answer {answers[0]['text']!r}")
if precision == "fp32":
    for a in answers:
        check(a["ids"][:8] == a["transformers_ids"][:8], f"fp32 ids begin as transformers': {a['ids'][:8]}")
write_reference(out, {"reference": f"onnxruntime-genai {og.__version__} greedy on the builder's {precision} folder, "
                                   "CPU", "eos_token_id": source["eos_token_id"],
                      "max_new_tokens": source["max_new_tokens"], "chats": answers,
                      "equal_to_transformers": sum(a["ids"] == a["transformers_ids"] for a in answers)})
