"""The decoder commands' defaults (issue 57, items 3, 4 and 7): `npurt generate --prompt` goes through the folder's
chat template where it has one (as OpenVINO GenAI's LLMPipeline does; `--raw` sends the text as it is), `--threads`
sets the engine's threads, and `generate` / `chat` keep their derived form and its verdict in npurt's cache
directory, so that a second load in a fresh process reuses them (`--cache-dir` elsewhere, `--no-cache` none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npurt import Tokenizer
from npurt.cli import main
from npurt.cli.common import default_cache_dir
from npurt.models.tokenizer_files import write_tokenizer
from tests.helpers.decoders import decoder_folder

CPU = ["--backend", "vaiml", "--device", "cpu"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """"chat": a decoder with a tokenizer and its ChatML template; "plain": the same tokenizer without a template."""
    root = tmp_path_factory.mktemp("decoder-defaults")
    chat = decoder_folder(root / "chat", "gqa")
    write_tokenizer(chat, "bytelevel", 512)
    plain = decoder_folder(root / "plain", "gqa")
    write_tokenizer(plain, "bytelevel", 512, chat_template=None)
    return {"chat": chat, "plain": plain}


def generate(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = main(["generate", *args, "--max-new-tokens", "2", *CPU, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_a_prompt_goes_through_the_chat_template_where_the_folder_has_one(folders, capsys):
    folder = folders["chat"]
    tok = Tokenizer(folder)
    assert tok.chat_template is not None
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], True, tokenize=True)
    code, out, err = generate(capsys, str(folder), "--prompt", "Hi")
    assert code == 0, err
    assert out["prompt_ids"] == chat and out["prompt_form"] == "chat template"
    code, explicit, _ = generate(capsys, str(folder), "--prompt", "Hi", "--chat")  # the default, said outright
    assert explicit["prompt_ids"] == chat
    code, raw, _ = generate(capsys, str(folder), "--prompt", "Hi", "--raw")
    assert raw["prompt_ids"] == tok.encode("Hi") != chat and raw["prompt_form"] == "raw text"
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    code, out, _ = generate(capsys, str(folder), "--prompt", "Hi", "--system", "Be brief.")
    assert out["prompt_ids"] == tok.apply_chat_template(system, True, tokenize=True)
    code, out, _ = generate(capsys, str(folder), "--prompt-ids", "1,17,42")  # ids are ids
    assert out["prompt_ids"] == [1, 17, 42] and out["prompt_form"] == "ids as given"


def test_a_folder_without_a_template_sends_the_text_as_it_is(folders, capsys):
    folder = folders["plain"]
    tok = Tokenizer(folder)
    assert tok.chat_template is None
    code, out, err = generate(capsys, str(folder), "--prompt", "Hi")
    assert code == 0, err
    assert out["prompt_ids"] == tok.encode("Hi") and out["prompt_form"] == "raw text"
    for flag in (["--chat"], ["--system", "Be brief."]):
        code, _, err = generate(capsys, str(folder), "--prompt", "Hi", *flag)
        assert code == 2 and f"{flag[0]}: " in err and "has no chat template" in err, err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt", "Hi", "--chat", "--raw"], "not allowed with argument"),
    (["--prompt", "Hi", "--raw", "--system", "S"], "--system needs the chat template: leave out --raw"),
    (["--prompt-ids", "1,2", "--raw"], "--raw is about --prompt's text"),
    (["--prompt-ids", "1,2", "--chat"], "--chat is about --prompt's text"),
    (["--prompt-ids", "1,2", "--system", "S"], "--system is about --prompt's text"),
    (["--prompt-ids", "1,2", "--threads", "0"], "--threads 0: must be 1 or more"),
    (["--prompt-ids", "1,2", "--no-cache", "--cache-dir", "x"], "not allowed with argument"),
])
def test_bad_flags_are_one_line_usage_errors(folders, capsys, args, message):
    with pytest.raises(SystemExit) as exited:  # argparse's own (mutually exclusive flags) exit
        code = main(["generate", str(folders["chat"]), *args, *CPU])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_help_says_what_a_prompt_goes_through(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "through the folder's chat template where it has one, else (or with --raw) the text as it is" in text
    for flag in ("--raw", "--chat", "--threads", "--cache-dir", "--no-cache"):
        assert flag in text
    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    text = capsys.readouterr().out
    assert "--threads" in text and "--cache-dir" in text and "--no-cache" in text


def test_threads_set_the_engine_s_threads(folders, capsys):
    for threads in ("1", "2"):
        code, out, err = generate(capsys, str(folders["chat"]), "--prompt-ids", "1,17,42", "--threads", threads)
        assert code == 0, err
        assert out["engine_settings"]["intra_op_num_threads"] == threads


def npurt(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npurt", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_a_second_load_in_a_fresh_process_reuses_the_derived_form_and_its_verdict(folders, tmp_path):
    """$NPURT_CACHE_DIR: the first `npurt generate` derives the decoder's form, checks it against the export (a
    child process) and stores both, and ONNX Runtime's optimized model; the second, a new process, writes none of
    them again and loads the session from the cache. --cache-dir names another directory; --no-cache writes none."""
    cache = tmp_path / "cache"
    env = {"NPURT_CACHE_DIR": str(cache)}
    args = ["generate", str(folders["chat"]), "--prompt-ids", "1,17,42", "--max-new-tokens", "4", *CPU, "--json"]
    first = npurt(env, *args)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["cache_dir"] == str(cache)
    assert [step for step, _ in out["load_steps"][1:]] == ["compiled and stored in the cache"]
    derived = sorted((cache / "decoders").glob("*/decoder_static.onnx"))
    verdicts = sorted((cache / "decoders").glob("*/verified-*.json"))
    assert len(derived) == 1 and len(verdicts) == 1 and json.loads(verdicts[0].read_text())["ok"]
    written = {p: p.stat().st_mtime_ns for p in [*derived, *verdicts]}
    second = npurt(env, *args)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["ids"] == out["ids"]
    assert [step for step, _ in again["load_steps"][1:]] == ["loaded from the cache"]
    assert {p: p.stat().st_mtime_ns for p in written} == written  # neither derived nor checked again
    assert again["decoder"]["verification"] == out["decoder"]["verification"]

    other = tmp_path / "other"
    done = npurt(env, *args, "--cache-dir", str(other))
    assert done.returncode == 0 and json.loads(done.stdout)["cache_dir"] == str(other), done.stderr
    assert len(list((other / "decoders").glob("*/verified-*.json"))) == 1
    before = sorted(p for p in tmp_path.rglob("*"))
    done = npurt(env, *args, "--no-cache")
    assert done.returncode == 0, done.stderr
    off = json.loads(done.stdout)
    assert off["cache_dir"] is None and [s for s, _ in off["load_steps"][1:]] == ["compiled"]
    assert sorted(p for p in tmp_path.rglob("*")) == before and off["ids"] == out["ids"]


def test_the_default_cache_directory(monkeypatch, tmp_path):
    """$NPURT_CACHE_DIR, else $XDG_CACHE_HOME/npurt/compiled (an absolute one: the spec ignores others), else
    ~/.cache/npurt/compiled: where `npurt cache` looks too."""
    monkeypatch.setenv("NPURT_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("NPURT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "npurt" / "compiled"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "npurt" / "compiled"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path(tmp_path / "home" / ".cache" / "npurt" / "compiled")


def test_an_unwritable_default_cache_runs_without_one(folders, tmp_path, capsys, monkeypatch):
    """The default directory cannot be made (here: a file is in its way): the command runs without a cache and says
    so on stderr in one line; a --cache-dir that is a file is a usage error."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("NPURT_CACHE_DIR", str(blocker / "cache"))
    code, out, err = generate(capsys, str(folders["chat"]), "--prompt-ids", "1,17,42")
    assert code == 0 and out["cache_dir"] is None, err
    assert f"npurt: no cache: cannot write {blocker / 'cache'}" in err
    code, _, err = generate(capsys, str(folders["chat"]), "--prompt-ids", "1,17,42", "--cache-dir", str(blocker))
    assert code == 2 and f"--cache-dir {blocker}: not a directory" in err


def test_cache_clear_removes_the_decoders_derived_forms(tmp_path, capsys):
    """`npurt cache clear` empties the decoders' folder of the cache too (their derived forms and verdicts; the
    weights there are links to the exports' files, which stay); --stale keeps them (they are never stale, only
    unused)."""
    from npurt.cli import main

    derived = tmp_path / "decoders" / "0123"
    derived.mkdir(parents=True)
    (derived / "decoder_static.onnx").write_bytes(b"x")
    assert main(["cache", "clear", "--stale", "--cache-dir", str(tmp_path)]) == 0
    assert derived.is_dir()
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert not derived.exists() and "1 decoders' derived forms" in capsys.readouterr().out
