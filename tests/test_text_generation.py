"""Text generation and chat sessions over npurt.Generator (issue 44): the new ids equal onnxruntime-genai's greedy
ids from the same prompt ids (as transformers encodes the text), the text equals transformers' decode of them, stop
strings and finish reasons, and a chat's turn 2 prefills only its new tokens and gives the tokens a fresh run over
the whole conversation gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from npurt import ChatSession, Generator, RunnerFactory, Tokenizer
from npurt.text import ContextFullError, DecodeStream, NoTokenizerError, generate_text, stream_text
from tests.helpers.decoders import (
    EOS_TOKEN_ID,
    MODEL_FILE,
    assert_tokens_agree,
    decoder_folder,
    greedy_genai,
    greedy_onnxruntime,
    require_genai,
)
from tests.helpers.text import KIND_SHAPES, TEXTS, auto_tokenizer, text_folder

MAX_LENGTH = 160
BACKENDS = {"VAIML": {}, "OPENVINO": {"inference_precision": "f32"}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("text-generation")
    return {kind: text_folder(root, shape, kind) for kind, shape in KIND_SHAPES.items()}


def runner(folder, backend="VAIML", max_length=MAX_LENGTH, chunk=16):
    return RunnerFactory.create_runner(backend, folder / MODEL_FILE, {
        "device": "CPU", "decoder": {"max_length": max_length, "prefill_chunk": chunk}, **BACKENDS[backend]})


def without_eos(ids):
    return ids[:-1] if ids and ids[-1] == EOS_TOKEN_ID else ids


@pytest.mark.parametrize("kind", list(KIND_SHAPES))
def test_text_in_text_out_equals_the_references(folders, kind):
    """From text: the prompt ids are transformers' encoding, the new ids onnxruntime-genai's greedy ids from them,
    the text transformers' decode of the new ids, whole and streamed."""
    require_genai()
    folder, ref = folders[kind], auto_tokenizer(folders[kind])
    tok = Tokenizer(folder)
    with runner(folder) as r, Generator(r) as gen:
        for name in ("ascii", "latin1", "cjk", "emoji", "code"):
            result = generate_text(gen, tok, TEXTS[name], 24)
            assert result.prompt_ids == ref.encode(TEXTS[name])
            assert without_eos(result.ids) == greedy_genai(folder, result.prompt_ids, 24), name
            assert result.text == ref.decode(result.ids, skip_special_tokens=True), name
            assert result.finish_reason == ("stop" if result.ids[-1] == EOS_TOKEN_ID else "length")
            stream = stream_text(gen, tok, TEXTS[name], 24)
            assert "".join(stream) == result.text and stream.result.ids == result.ids
            assert stream.result.stats["text_us_per_token"] > 0


def test_chat_messages_are_rendered_and_encoded_as_transformers_does(folders):
    require_genai()
    folder = folders["bytelevel"]
    tok, ref = Tokenizer(folder), auto_tokenizer(folder)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"}]
    with runner(folder) as r, Generator(r) as gen:
        result = generate_text(gen, tok, chat, 16)
    assert result.prompt_ids == ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                        sanitize_control_tokens=True, return_dict=False)
    assert without_eos(result.ids) == greedy_genai(folder, result.prompt_ids, 16)


@pytest.mark.parametrize("kind", list(KIND_SHAPES))
def test_a_stop_string_spanning_tokens_ends_the_text_and_is_not_shown(folders, kind):
    folder = folders[kind]
    tok = Tokenizer(folder)
    with runner(folder) as r, Generator(r) as gen:
        whole = generate_text(gen, tok, "Once upon a time", 40, eos_token_id=[])
        # a stop string across the boundary of two pieces the stream gave out, met there first
        stream, pieces = DecodeStream(tok, True), []
        for t in whole.ids:
            pieces.append(stream.step(t))
        bounds, at = [], 0
        for piece in pieces[:-1]:
            at += len(piece)
            if piece:
                bounds.append(at)
        text = whole.text
        spanning = [(b, text[b - 2:b + 2]) for b in bounds if 2 <= b <= len(text) - 2
                    and text.find(text[b - 2:b + 2]) == b - 2]
        assert spanning, (pieces, text)
        cut, stop = spanning[len(spanning) // 2]
        result = generate_text(gen, tok, "Once upon a time", 40, eos_token_id=[], stop=["never there", stop])
        assert result.text == text[:cut - 2] and stop not in result.text
        assert (result.finish_reason, result.stop) == ("stop", stop) and len(result.ids) < len(whole.ids)
        assert result.ids == whole.ids[:len(result.ids)]
        streamed = stream_text(gen, tok, "Once upon a time", 40, eos_token_id=[], stop=stop)
        assert "".join(streamed) == result.text and streamed.result.finish_reason == "stop"
        # an eos id ends it too ("stop"), its text never shown; else "length"
        eos = whole.ids[5]
        first = whole.ids.index(eos)
        ended = generate_text(gen, tok, "Once upon a time", 40, eos_token_id=eos, skip_special_tokens=False)
        assert ended.ids == whole.ids[:first + 1] and ended.finish_reason == "stop"
        assert ended.text == tok.decode(whole.ids[:first])
        assert generate_text(gen, tok, "Once upon a time", 3, eos_token_id=[]).finish_reason == "length"


def test_bad_input_is_a_clear_error(folders, tmp_path):
    folder = folders["bytelevel"]
    tok = Tokenizer(folder)
    with runner(folder, max_length=32) as r, Generator(r) as gen:
        with pytest.raises(ContextFullError, match=r"the prompt is \d+ tokens; the decoder's cache holds 32") as e:
            generate_text(gen, tok, TEXTS["code"] * 3)
        assert e.value.max_length == 32 and e.value.prompt_tokens > 32
        n = len(tok.encode("Hi you"))
        with pytest.raises(ContextFullError, match=rf"the prompt is {n} tokens and 40 new ones need {n + 39} "
                                                   rf"rows; the decoder's cache holds 32 \(at most {33 - n} new "
                                                   r"tokens fit\)"):
            generate_text(gen, tok, "Hi you", 40)
        with pytest.raises(ValueError, match="empty stop string"):
            generate_text(gen, tok, "Hi", 4, stop=["\n", ""])
        with pytest.raises(TypeError, match="prompt: text, a list of chat messages"):
            generate_text(gen, tok, [1.5, 2], 4)
        assert gen.tokens == ()  # nothing ran
        assert generate_text(gen, tok, "Hi you", 33 - n).finish_reason in ("stop", "length")  # exactly fits
    bare = decoder_folder(tmp_path, "gqa")
    with pytest.raises(NoTokenizerError, match="token ids work without one"):
        Tokenizer(bare)


# ------------------------------------------------------------------------------------------------------- chat
def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("kind", list(KIND_SHAPES))
def test_a_chat_turn_prefills_only_what_is_new(folders, kind, backend):
    """Turn 2 feeds only the ids past the common prefix with the cache (the reply's own ids kept: the conversation
    begins with turn 1's prompt and reply ids), and makes the tokens plain ONNX Runtime makes from the whole
    conversation at once."""
    folder = folders[kind]
    tok = Tokenizer(folder)
    with runner(folder, backend) as r, Generator(r) as gen:
        chat = ChatSession(gen, tok, system="You are brief.", max_new_tokens=12)
        first = chat.send("Hello there, café?")
        assert chat.stats["cached_tokens"] == 0 and chat.stats["prompt_tokens"] == len(first.prompt_ids)
        assert chat.messages[-1] == {"role": "assistant", "content": first.text}
        second = chat.send("And in 日本語?")
        kept = first.prompt_ids + without_eos(first.ids)
        assert second.prompt_ids[:len(kept)] == kept  # the reply was not re-encoded
        cached = chat.stats["cached_tokens"]
        assert cached == lcp(first.prompt_ids + first.ids[:-1], second.prompt_ids) >= len(kept) - 1
        assert chat.stats["prompt_tokens"] == len(second.prompt_ids) - cached < len(second.prompt_ids) // 2
        reference = greedy_onnxruntime(folder / MODEL_FILE, second.prompt_ids, 12, eos_token_id=EOS_TOKEN_ID)
        assert_tokens_agree(second.ids, reference, f"turn 2 on {backend}")
        third = chat.stream("/reset? no, go on")
        assert "".join(third) == third.result.text and chat.stats["cached_tokens"] >= len(second.prompt_ids)


# earlier replies rendered as a placeholder, as templates that drop earlier reasoning rewrite them
SHORTENS_REPLIES = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
                    "(a reply){% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("how", ["template", "stop string"])
def test_a_turn_whose_history_changed_is_prefilled_again(folders, tmp_path, how):
    """A template that renders earlier replies otherwise, or a reply cut at a stop string: the conversation is
    encoded whole, the common prefix ends where it differs from the cache, and the tokens are those of a fresh run
    over it."""
    folder = tmp_path / "rewrites"
    shutil.copytree(folders["bytelevel"], folder)
    if how == "template":
        (folder / "chat_template.jinja").write_text(SHORTENS_REPLIES)
    tok = Tokenizer(folder)
    with runner(folder) as r, Generator(r) as gen:
        chat = ChatSession(gen, tok, max_new_tokens=10)
        first = chat.send("one")
        if how == "stop string":
            stop = first.text[2:4]
            chat = ChatSession(gen, tok, max_new_tokens=10, stop=stop)
            first = chat.send("one")
            assert first.stop == stop and first.text == first.text.split(stop)[0]
        second = chat.send("two!", stop=[])  # (no stop string this turn)
        assert second.prompt_ids == tok.apply_chat_template(chat.messages[:-1], True, tokenize=True)
        reference = greedy_onnxruntime(folder / MODEL_FILE, second.prompt_ids, 10, eos_token_id=EOS_TOKEN_ID)
        assert_tokens_agree(second.ids, reference, "turn 2 after a re-render")
        assert len(first.prompt_ids) - 2 <= chat.stats["cached_tokens"] < len(first.prompt_ids) + len(first.ids)


def test_a_full_context_names_the_lengths_or_drops_the_oldest_turns(folders):
    folder = folders["bytelevel"]
    tok = Tokenizer(folder)
    with runner(folder, max_length=96) as r, Generator(r) as gen:
        chat = ChatSession(gen, tok, system="sys", max_new_tokens=8)
        with pytest.raises(ContextFullError, match=r"the conversation is \d+ tokens with this message; the "
                                                   r"decoder's cache holds 96: go on with on_full='drop_oldest'"):
            for _ in range(10):
                chat.send("tell me more about it")
        before = list(chat.messages)
        assert len(before) >= 5 and before[-1]["role"] == "assistant"  # the refused message was not added
        assert chat.stats["conversation_tokens"] + 8 - 1 <= 96
        assert chat.drop_oldest() and chat.messages[0]["role"] == "system" and len(chat.messages) == len(before) - 2
        chat.send("tell me more about it")
        dropping = ChatSession(gen, tok, system="sys", max_new_tokens=8, on_full="drop_oldest")
        for _ in range(10):
            result = dropping.send("tell me more about it")
            assert dropping.messages[0] == {"role": "system", "content": "sys"}
            reference = greedy_onnxruntime(folder / MODEL_FILE, result.prompt_ids, 8, eos_token_id=EOS_TOKEN_ID)
            assert_tokens_agree(result.ids, reference, "a turn after the oldest were dropped")
        resetting = ChatSession(gen, tok, max_new_tokens=8, on_full="reset")
        for _ in range(6):
            resetting.send("tell me more about it")
        assert len(resetting.messages) <= 6
        with pytest.raises(ContextFullError, match="even with the oldest turns dropped"):
            dropping.send("long " * 80)
        with pytest.raises(ValueError, match="on_full: one of error, drop_oldest, reset"):
            ChatSession(gen, tok, on_full="wrap")


# -------------------------------------------------------------------------------------------------- commands
def npurt(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "npurt", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_npurt_generate_takes_text(folders, tmp_path):
    folder = folders["bytelevel"]
    tok = Tokenizer(folder)
    done = npurt("generate", str(folder), "--prompt", "Hello café", "--raw", "--max-new-tokens", "12", "--backend",
                 "vaiml", "--device", "cpu", "--json")  # (--raw: the text as it is; the folder's template by default)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    with runner(folder) as r, Generator(r) as gen:
        want = generate_text(gen, tok, "Hello café", 12)
    assert (out["ids"], out["text"], out["finish_reason"]) == (want.ids, want.text, want.finish_reason)
    done = npurt("generate", str(folder / MODEL_FILE), "--prompt-ids", ",".join(map(str, want.prompt_ids)),
                 "--max-new-tokens", "12", "--backend", "vaiml", "--device", "cpu")
    assert done.returncode == 0 and f"Text     {want.text!r}" in done.stdout, done.stdout + done.stderr
    done = npurt("generate", str(folder), "--prompt", "Hi <|im_end|>", "--chat", "--system", "Be brief.",
                 "--max-new-tokens", "4", "--stop", "zzz", "--backend", "vaiml", "--device", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"}]
    assert json.loads(done.stdout)["prompt_ids"] == tok.apply_chat_template(chat, True, tokenize=True)
    done = npurt("generate", str(folder), "--prompt", "Hi", "--stop", "", "--backend", "vaiml", "--device", "cpu")
    assert done.returncode == 2 and "empty stop string" in done.stderr
    bare = decoder_folder(tmp_path, "gqa")
    done = npurt("generate", str(bare), "--prompt", "Hello", "--backend", "vaiml", "--device", "cpu")
    assert done.returncode == 2 and "--prompt needs the model's tokenizer" in done.stderr
    done = npurt("generate", str(bare), "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--backend", "vaiml",
                 "--device", "cpu", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["text"] is None
    helps = npurt("generate", "--help").stdout + npurt("chat", "--help").stdout
    assert "--prompt" in helps and not any(flag in helps for flag in ("--shape", "--frame", "--hw-view"))


def test_npurt_chat(folders):
    done = npurt("chat", str(folders["metaspace"]), "--system", "Be brief.", "--max-new-tokens", "6",
                 "--backend", "vaiml", "--device", "cpu", stdin="Hello\nAgain\n/reset\nOnce more\n/exit\nnot read\n")
    assert done.returncode == 0, done.stderr
    turns = [line for line in done.stderr.splitlines() if "tokens/s" in line]
    assert len(turns) == 3 and "(conversation reset)" in done.stderr
    assert "prefilled" in turns[1] and "(cached 0)" not in turns[1]


def test_a_reply_left_unfinished_ends_where_the_next_turn_starts(folders):
    """A turn whose stream the app stopped reading: the next turn closes it (the Generator's loop ends, its reply
    is what was shown) and goes on; its ids are encoded anew (they hold text never shown)."""
    folder = folders["bytelevel"]
    tok = Tokenizer(folder)
    with runner(folder) as r, Generator(r) as gen:
        chat = ChatSession(gen, tok, max_new_tokens=12)
        stream = chat.stream("Hello")
        shown = next(stream, "")
        second = chat.send("Next")
        assert stream.result is not None and stream.result.closed and stream.result.finish_reason == "length"
        assert stream.result.text == shown and len(stream.result.ids) < 12
        assert [m["content"] for m in chat.messages] == ["Hello", shown, "Next", second.text]
        assert second.prompt_ids == tok.apply_chat_template(chat.messages[:-1], True, tokenize=True)
        reference = greedy_onnxruntime(folder / MODEL_FILE, second.prompt_ids, 12, eos_token_id=EOS_TOKEN_ID)
        assert_tokens_agree(second.ids, reference, "the turn after an unfinished one")
        with chat.stream("Third") as third:
            next(third, "")
        assert third.result is not None and third.result.closed
        chat.reset()
        assert chat.messages == [] and chat.send("Again").finish_reason in ("stop", "length")


def test_a_chat_on_the_htp_emulator_prefills_only_what_is_new(folders):
    """QNN's HTP emulator (static shapes: the prefill in chunks of 8, the last placed to end at the prompt's end):
    turn 2 runs only the chunks past the common prefix, and its tokens are plain ONNX Runtime's over the whole
    conversation up to an FP16 near-tie."""
    from tests.helpers.qnn import require_qnn

    require_qnn()
    folder = folders["bytelevel"]
    tok = Tokenizer(folder)
    with RunnerFactory.create_runner("QNN", folder / MODEL_FILE, {
            "device": "NPU", "decoder": {"max_length": 96, "prefill_chunk": 8}, "max_compiled_shapes": 1}) as r, \
            Generator(r) as gen:
        assert r.decoder.pinned
        chat = ChatSession(gen, tok, system="Be brief.", max_new_tokens=8)
        first = chat.send("Hello")
        second = chat.send("Again")
        cached, new = chat.stats["cached_tokens"], chat.stats["prompt_tokens"]
        assert cached == lcp(first.prompt_ids + first.ids[:-1], second.prompt_ids) and cached + new == len(
            second.prompt_ids)
        assert chat.stats["prefill_chunks"] == -(-new // 8) and chat.stats["copies"] == 0
        reference = greedy_onnxruntime(folder / MODEL_FILE, second.prompt_ids, 8, eos_token_id=EOS_TOKEN_ID)
        # (twice tests/test_generate.py's FP16_LOGITS: where FP16 may flip a pick)
        assert_tokens_agree(second.ids, reference, "turn 2 on the HTP emulator", tolerance=0.12)
