"""Tokenizers for the test decoders, trained here with HF ``tokenizers``: ``tokenizer.json`` and
``tokenizer_config.json`` (and a chat template) beside a decoder's model, with its exact vocabulary size and its
pad / bos / eos ids (0 / 1 / 2). Nothing is downloaded or committed: the corpus is made here from a fixed seed.

Two kinds, the two a Hugging Face model folder ships:

- ``"bytelevel"``: GPT-2 / Llama 3 / Qwen style byte-level BPE (every byte a symbol, a space is ``Ġ``);
- ``"metaspace"``: SentencePiece style BPE (Llama 2, Mistral, Phi-3): a space is ``▁``, one is prepended to the
  text, and a character outside the vocabulary falls back to its UTF-8 bytes (``<0x41>`` tokens).

    write_tokenizer(folder, "bytelevel", vocab_size=512, chat_template=CHATML)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # ChatML's turn markers: added (special) tokens
KINDS = ("bytelevel", "metaspace")

# The ChatML template (Qwen's form, system prompt optional), a common shape and the test decoders' default
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SAMPLES = [  # the scripts and shapes of text the tests encode: each gets into the vocabulary somewhat
    "The quick brown fox jumps over the lazy dog.", "café naïve über señor Ångström façade crème brûlée",
    "日本語のテキストを分割します。中文字符和标点，한국어 문장도 있습니다.", "emoji 😀 👍🏽 🚀 👨‍👩‍👧 ✨ ❤️",
    "def add(x, y):\n    return x + y\n\nfor i in range(10):\n    print(f\"{i}: {add(i, 1)}\")",
    "    indented\tand\ttabbed   lines\n\n\n  with   runs of   spaces  ", "<html><body>a &amp; b</body></html>",
    "numbers 3.14159 2026-11-27 1,000,000 #42 @user $5 100%", "user: hello\nassistant: hi, how can I help?",
]
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "an", "er", "in", "on", "the", "ing", "ed", "es",
              "re", "st", "ch", "qu", "ou", "ai", "ly", "tion", "pre", "con", "ex", "un", "ab", "ol"]


def corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """Training text: made-up words from syllables, mixed with the samples above (a fixed seed: the same lines
    every time)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for i in range(lines):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
        if i % 3 == 0:
            line += " " + rng.choice(_SAMPLES)
        if i % 7 == 0:
            line = line.capitalize() + "."
        out.append(line)
    return out


def write_tokenizer(folder: Path, kind: str = "bytelevel", vocab_size: int = 512, *,
                    chat_template: str | None = CHATML, seed: int = 0) -> Path:
    """Train a ``kind`` tokenizer of exactly ``vocab_size`` ids (pad 0, bos 1, eos 2, the ChatML markers added as
    special tokens) and write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder``; returns it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind not in KINDS:
        raise ValueError(f"kind: one of {', '.join(KINDS)}, got {kind!r}")
    specials = [PAD, BOS, EOS] + ([UNK] if kind == "metaspace" else [])
    markers = [IM_START, IM_END]
    text = corpus(seed=seed)
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(markers), special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(text, trainer)
    else:
        # the trained pieces leave room for the 256 byte tokens, placed after the specials as SentencePiece does
        pieces = Tokenizer(models.BPE(unk_token=UNK))
        pieces.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(markers) - 256, special_tokens=specials,
                                      limit_alphabet=120, show_progress=False)
        pieces.train_from_iterator(text, trainer)
        trained = json.loads(pieces.to_str())["model"]
        vocab = {t: i for i, t in enumerate(specials)}
        vocab.update({f"<0x{b:02X}>": len(specials) + b for b in range(256)})
        for token, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
            if token not in vocab:
                vocab[token] = len(vocab)
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK, byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in markers])
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        raise RuntimeError(f"the {kind} tokenizer came out with {size} ids, not {vocab_size}: the corpus is too "
                           "small for that vocabulary")
    ids = {t: tok.token_to_id(t) for t in (PAD, BOS, EOS)}
    if list(ids.values()) != [0, 1, 2]:
        raise RuntimeError(f"the {kind} tokenizer's pad / bos / eos ids are {ids}, not 0 / 1 / 2")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "TokenizersBackend", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                                          "rstrip": False, "single_word": False, "special": True}
                                 for t in specials + markers},
    }
    if kind == "metaspace":
        config["unk_token"] = UNK
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return folder
