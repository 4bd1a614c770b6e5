"""``npurt.Tokenizer(model_dir_or_file)``: the model folder's tokenizer and chat template, with transformers'
names and results (``encode``, ``decode``, ``apply_chat_template``), over HF ``tokenizers`` (the Rust library that
reads the ``tokenizer.json`` every Hugging Face-format model ships) and jinja2 (where a template is rendered).

Exact means transformers 5's ``AutoTokenizer`` on the same folder (the reference; npurt never imports it): the same
ids for ``encode(text, add_special_tokens)``, the same text for ``decode``, the same rendered chat. What transformers
5 does with the folder's files, done here too: ``add_bos_token`` / ``add_eos_token`` are ignored where
``tokenizer.json`` exists (its post-processor rules); named special tokens and ``added_tokens_decoder`` entries the
tokenizer lacks are added (as special tokens); ``clean_up_tokenization_spaces`` applies to non-BPE models only.
transformers 5 rebuilds some named tokenizer classes (e.g. ``LlamaTokenizer``) from the vocabulary with a pipeline
of its own; npurt reads ``tokenizer.json`` as written (as ``tokenizers`` and onnxruntime-genai do).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import files
from .errors import NoTokenizerError

if TYPE_CHECKING:
    import tokenizers

__all__ = ["NoTokenizerError", "Tokenizer"]


class Tokenizer:
    """The tokenizer and chat template of a model folder (or of the folder a model file is in).

    NoTokenizerError (a FileNotFoundError) where the folder has no ``tokenizer.json``; ValueError where a file is
    damaged, naming it."""

    def __init__(self, model_dir_or_file: str | os.PathLike[str]) -> None:
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend

        self.files = files.read(model_dir_or_file)
        self.folder = self.files.folder
        try:
            backend = Backend.from_file(str(self.files.tokenizer_json))
        except Exception as e:  # noqa: BLE001 - tokenizers raises Exception for a file it cannot parse
            raise ValueError(f"{self.files.tokenizer_json}: not a tokenizer this version of HF tokenizers reads "
                             f"({type(e).__name__}: {_first_line(e)})") from None
        self.backend_tokenizer: tokenizers.Tokenizer = backend
        backend.no_truncation()
        backend.no_padding()
        # what transformers 5 adds at load: added_tokens_decoder entries, then the special tokens, the tokenizer lacks
        have = {t.content for t in backend.get_added_tokens_decoder().values()}
        missing: list[AddedToken] = []
        for _, token in sorted(self.files.added_tokens_decoder.items()):
            content = files.token_content(token)
            if content is not None and content not in have:
                missing.append(_added_token(token, special=bool(token.get("special", False))))
                have.add(content)
        for value in [*self.files.special_tokens.values(), *self.files.extra_special_tokens]:
            content = files.token_content(value)
            if content is not None and content not in have:
                missing.append(_added_token(value, special=True))
                have.add(content)
        if missing:
            backend.add_tokens(missing)
        self.special_tokens_map: dict[str, str] = {
            name: str(files.token_content(v)) for name, v in self.files.special_tokens.items()}
        self.bos_token = self.special_tokens_map.get("bos_token")
        self.eos_token = self.special_tokens_map.get("eos_token")
        self.pad_token = self.special_tokens_map.get("pad_token")
        self.unk_token = self.special_tokens_map.get("unk_token")
        self.bos_token_id = self.convert_tokens_to_ids(self.bos_token) if self.bos_token else None
        self.eos_token_id = self.convert_tokens_to_ids(self.eos_token) if self.eos_token else None
        self.pad_token_id = self.convert_tokens_to_ids(self.pad_token) if self.pad_token else None
        self.eos_token_ids = files.eos_token_ids(self.files, self.eos_token_id)
        self.sampling_defaults = dict(self.files.sampling_defaults)
        self.chat_templates = dict(self.files.chat_templates)
        self.chat_template = self.chat_templates.get("default")
        added = backend.get_added_tokens_decoder()
        self._added = {t.content: i for i, t in added.items()}
        self.all_special_ids = sorted(i for i, t in added.items() if t.special)
        self.cleans_up_spaces = bool(  # transformers' clean_up_tokenization_spaces, where it applies
            self.files.config.get("clean_up_tokenization_spaces", False)) and (
            type(backend.model).__name__ != "BPE"
            or bool(self.files.config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
        # the decoder's, not the model's flag: the decoder joins the byte tokens into text, whatever the model (a
        # Unigram model does not expose its flag)
        self.byte_fallback = _decodes_bytes(backend.decoder)

    # ------------------------------------------------------------------------------------------------ ids and text
    def __len__(self) -> int:
        """The vocabulary, added tokens included (transformers' ``len(tokenizer)``)."""
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without the added tokens (as transformers has it; ``len(tokenizer)`` counts them
        too: the decoder's logits are that wide)."""
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=False))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (``add_special_tokens``: what the tokenizer's post-processor adds, e.g. a bos id)."""
        if not isinstance(text, str):
            raise TypeError(f"text: a str, got {type(text).__name__}")
        return list(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (``skip_special_tokens``: leave out the special tokens' text, as transformers)."""
        ids = self._checked_ids(ids)
        text = str(self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
        return clean_up_tokenization(text) if self.cleans_up_spaces else text

    def _checked_ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, int):
            ids = [ids]
        try:
            out = [int(i) for i in ids]
        except (TypeError, ValueError):
            raise TypeError(f"ids: a sequence of token ids, got {ids!r}") from None
        size = len(self)
        bad = [i for i in out if not 0 <= i < size]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the tokenizer's vocabulary (0 .. {size - 1})")
        return out

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of one token (its vocabulary string, e.g. ``"<|im_start|>"``); None where there is none."""
        value = self.backend_tokenizer.token_to_id(token)
        return None if value is None else int(value)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary strings of ``ids`` (``Ġ``, ``▁`` and ``<0xE6>`` as the vocabulary writes them)."""
        return [str(self.backend_tokenizer.id_to_token(int(i))) for i in ids]

    def is_byte_fallback_token(self, token_id: int) -> bool:
        """Whether ``token_id`` is one byte of a character outside the vocabulary (``<0xE6>``), as the decoder reads
        it (``byte_fallback``: the decoder has a ByteFallback step). A run of such tokens is decoded as a whole:
        its text is final only once a token that is not one follows (a streaming decoder holds it)."""
        if not self.byte_fallback:
            return False
        token = self.backend_tokenizer.id_to_token(int(token_id))
        return token is not None and is_byte_token(token)

    # ------------------------------------------------------------------------------------------------- chat template
    def get_chat_template(self, chat_template: str | None = None, tools: list[Any] | None = None) -> tuple[str, str]:
        """The template to render and its name for errors: ``chat_template`` (a template's source, or the name of one
        of the folder's), else "tool_use" where tools are given and the folder has one, else the default."""
        where = self.files.chat_template_source or str(self.folder)
        if chat_template is not None and chat_template not in self.chat_templates:
            if not re.search(r"\{[{%#]", chat_template):
                raise ValueError(f"chat_template {chat_template!r}: no template of that name in {where} (it has: "
                                 f"{', '.join(self.chat_templates) or 'none'})")
            return chat_template, "(passed as chat_template)"
        name = chat_template or ("tool_use" if tools is not None and "tool_use" in self.chat_templates
                                 else "default")
        if name not in self.chat_templates:
            if not self.chat_templates:
                raise ValueError(f"{self.folder} has no chat template (neither {files.CHAT_TEMPLATE_FILE} nor "
                                 f"{files.TOKENIZER_CONFIG}'s chat_template): pass chat_template=, or encode text")
            raise ValueError(f"{where} has no template named {name!r} (it has: {', '.join(self.chat_templates)})")
        label = where if len(self.chat_templates) == 1 else f"{name!r} of {where}"
        return self.chat_templates[name], label

    def apply_chat_template(self, messages: Sequence[Any], add_generation_prompt: bool = False,
                            tools: list[Any] | None = None, *, documents: list[Any] | None = None,
                            chat_template: str | None = None, tokenize: bool = False,
                            sanitize_control_tokens: bool = True, **template_vars: Any) -> Any:
        """The chat rendered by the folder's template as transformers renders it (its text, ``tokenize=False``, the
        default here), or its ids (``tokenize=True``: encoded as transformers encodes a chat, without the
        post-processor's special tokens). ``sanitize_control_tokens`` (with ``tokenize=True``): control tokens in the
        messages, tools and variables are encoded as plain text, only the template's own become control ids
        (transformers' prompt-injection guard; on here by default). ``template_vars`` go to the template (e.g.
        ``enable_thinking=False``), over the special tokens' names (``bos_token``, ...).

        ChatTemplateError (a ValueError) names the template and the cause."""
        if "continue_final_message" in template_vars:
            raise NotImplementedError("continue_final_message is not supported: end the messages with the user's "
                                      "and add_generation_prompt=True, or pass the rendered text to encode")
        text, source = self.render_chat(messages, add_generation_prompt, tools, documents=documents,
                                        chat_template=chat_template, mark=tokenize and sanitize_control_tokens,
                                        **template_vars)
        if not tokenize:
            return text
        return self.encode_chat(text) if sanitize_control_tokens else self.encode(text, add_special_tokens=False)

    def render_chat(self, messages: Sequence[Any], add_generation_prompt: bool = False,
                    tools: list[Any] | None = None, *, documents: list[Any] | None = None,
                    chat_template: str | None = None, mark: bool = False, **template_vars: Any) -> tuple[str, str]:
        """The rendered chat and the template's source. ``mark``: control tokens in the inputs are wrapped in
        markers first (the text ``encode_chat`` takes)."""
        from . import template

        source, name = self.get_chat_template(chat_template, tools)
        chat = template.normalize_messages(messages)
        variables = {**self.special_tokens_map, **template_vars}
        if mark:
            tokens, _ = template.control_patterns(self.control_tokens(source))
            chat = template.mark(chat, tokens)
            tools = template.mark(tools, tokens)
            documents = template.mark(documents, tokens)
            variables = {**self.special_tokens_map, **template.mark(template_vars, tokens)}
        text = template.render(source, name, chat, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, variables=variables)
        return text, source

    def mark_control_tokens(self, text: str, source: str) -> str:
        """``text`` as ``render_chat(mark=True)`` puts a string of the inputs into the chat."""
        from . import template

        tokens, _ = template.control_patterns(self.control_tokens(source))
        return str(template.mark(text, tokens))

    def control_tokens(self, source: str) -> tuple[str, ...]:
        """The tokens ``sanitize_control_tokens`` guards: the special added tokens, and the other added tokens the
        template writes itself (or, where tokenizer_config.json lists ``chat_control_tokens``, those)."""
        from . import template

        added = self.backend_tokenizer.get_added_tokens_decoder().values()
        listed = self.files.config.get("chat_control_tokens")
        if isinstance(listed, list):
            chosen = set(listed)
            return tuple(t.content for t in added if t.special or t.content in chosen)
        literal = template.literal_text(source)
        return tuple(t.content for t in added
                     if t.special or (t.content in literal and not t.content.isspace()))

    def encode_chat(self, rendered: str, continued: bool = False) -> list[int]:
        """The ids of a chat rendered from marked input (transformers' ``encode_marked_chat``): a marked control
        token is encoded as plain text, the rest as usual; lone markers are dropped (and still break the text).
        ``continued``: the text goes on from a chat's middle (no prefix space a SentencePiece-style tokenizer puts
        at a text's start)."""
        from . import template

        _, markers = template.control_patterns(tuple(self._added))
        pieces = markers.split(rendered)
        newline = self.encode("\n", add_special_tokens=False)
        ids = (self._encode_piece(pieces[0], False, newline) if continued and pieces[0]
               else self.encode(pieces[0], add_special_tokens=False))
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1  # odd pieces are the marked tokens
            piece_ids = self._encode_piece(piece, as_text, newline)
            if as_text and self._added.get(piece) in piece_ids:
                raise ValueError(f"cannot keep {piece!r} as plain text: the tokenizer makes it from plain text")
            ids += piece_ids
        return ids

    def _encode_piece(self, piece: str, as_text: bool, newline: list[int]) -> list[int]:
        # after a newline, so that a SentencePiece-style tokenizer adds no prefix space; then the newline removed
        encode = self._encode_plain if as_text else (lambda t: self.encode(t, add_special_tokens=False))
        ids = encode("\n" + piece)
        if ids[:len(newline)] == newline:
            return ids[len(newline):]
        return encode(piece)

    def _encode_plain(self, text: str) -> list[int]:
        """``text`` through the normalizer, pre-tokenizer and model only: no added token matched."""
        backend = self.backend_tokenizer
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        splits = [text]
        if backend.pre_tokenizer is not None:
            splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
        return [int(t.id) for s in splits for t in backend.model.tokenize(s)]

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.folder)!r}, vocab {len(self)}, chat templates {list(self.chat_templates)})"


# the tokens HF tokenizers' ByteFallback decoder reads as a byte: "<0x", two characters Rust's u8::from_str_radix
# takes in base 16 (two hex digits, or "+" and one), ">"
_BYTE_TOKEN = re.compile(r"<0x(?:[0-9A-Fa-f]{2}|\+[0-9A-Fa-f])>")


def is_byte_token(token: str) -> bool:
    """Whether a ByteFallback decoder reads ``token`` (a vocabulary string) as one byte (``<0xE6>``)."""
    return _BYTE_TOKEN.fullmatch(token) is not None


def _decodes_bytes(decoder: Any) -> bool:
    """Whether ``decoder`` (HF tokenizers') has a ByteFallback step, at any depth of its Sequences. One that
    cannot be serialized (a custom Python decoder) is taken to have one: a streaming decoder then holds the text of
    ``<0xE6>``-like tokens until their run ends, which costs latency, never text."""
    if decoder is None:
        return False
    try:
        state = json.loads(decoder.__getstate__())
    except Exception:  # noqa: BLE001 - a custom decoder raises whatever its __getstate__ does
        return True
    return _has_byte_fallback(state)


def _has_byte_fallback(node: Any) -> bool:
    if isinstance(node, dict):
        return node.get("type") == "ByteFallback" or any(_has_byte_fallback(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_byte_fallback(v) for v in node)
    return False


def _added_token(value: Any, special: bool) -> Any:
    from tokenizers import AddedToken

    if isinstance(value, str):
        return AddedToken(value, special=special)
    keys = ("single_word", "lstrip", "rstrip", "normalized")
    return AddedToken(str(value["content"]), special=special, **{k: bool(value[k]) for k in keys if k in value})


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (spaces before punctuation and in English contractions)."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",").replace(" ' ", "'")
            .replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s").replace(" 've", "'ve")
            .replace(" 're", "'re"))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
