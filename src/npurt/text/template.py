"""Chat templates rendered as transformers 5 renders them (``transformers.utils.chat_template_utils``): jinja2's
``ImmutableSandboxedEnvironment`` (chat templates from a model hub are untrusted code) with ``trim_blocks``,
``lstrip_blocks`` and loop controls, the ``{% generation %}`` tag accepted (it renders its body), ``tojson`` without
HTML escaping, ``raise_exception``, ``strftime_now``, a ``dict`` and a ``namespace`` that refuse underscored names.
What the template sees is rebuilt from plain JSON types (messages, tools, extra variables), messages' None values
dropped, reasoning fields aliased.

The prompt-injection guard (transformers' ``sanitize_control_tokens``): control tokens that appear in the user's
strings are wrapped in private-use markers before rendering, so that encoding takes them as plain text and only the
template's own control tokens become control ids.

jinja2 (>= 3.1.6: older ones have known sandbox escapes) is imported with this module: only where a template is
rendered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ChatTemplateError

MARK_START, MARK_END = "\U000f0000", "\U000f0001"  # transformers' markers (Supplementary Private Use Area-A)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _version_ok() -> None:
    major, minor, patch = (int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3])
    if (major, minor, patch) < (3, 1, 6):
        raise ImportError(f"chat templates need jinja2 >= 3.1.6 (older ones have known sandbox escapes); "
                          f"{jinja2.__version__} is installed: pip install -U 'jinja2>=3.1.6' (extra 'text')")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (transformers marks the assistant's tokens
    with it; npurt has no use for the mask)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` inside a template, without the type itself (no attribute access to hack through)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace, refusing underscore-prefixed attributes (no way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes on a "
                                              f"namespace, got {name!r}")


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template compiled in transformers' environment (cached: a chat renders one template every turn).
    jinja2's TemplateSyntaxError where it does not compile."""
    _version_ok()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (anything else becomes "<TypeName>"), as transformers does before a
    template sees it: objects carry methods the sandbox does not know to be dangerous."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":  # numpy scalars
        return plain(item())
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic models (the OpenAI SDK's messages)
        return plain(dump())
    return f"<{type(value).__name__}>"


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as dicts, None values dropped (OpenAI's ``content=None``), reasoning fields aliased (as transformers
    does: ``reasoning_content`` is what templates read; ``thinking`` for gpt-oss')."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages: a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a chat template needs at least one message")
    out = []
    for message in plain(list(messages)):
        if not isinstance(message, dict):
            raise TypeError(f"each message is a dict ({{'role': ..., 'content': ...}}), got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(source: str, name: str, messages: list[dict[str, Any]], *, tools: list[Any] | None,
           documents: list[Any] | None, add_generation_prompt: bool, variables: dict[str, Any]) -> str:
    """The rendered chat; ChatTemplateError naming the template (``name``) and the cause (a ``raise_exception``
    message in the template's own words)."""
    try:
        template = compile_template(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template {name} does not compile: line {e.lineno}: {e.message}") from None
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise TypeError(f"tools: JSON schemas (dicts), got {type(tool).__name__}")
    try:
        return template.render(messages=messages, tools=plain(tools), documents=plain(documents),
                               add_generation_prompt=add_generation_prompt, **plain(variables))
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"chat template {name} did something its sandbox refuses: {e}") from None
    except jinja2.TemplateError as e:
        if type(e) is jinja2.TemplateError:  # raise_exception: the template's own words
            raise ChatTemplateError(f"chat template {name} refused the messages: {e.message}") from None
        raise ChatTemplateError(f"chat template {name} failed: {type(e).__name__}: {e.message}") from None
    except Exception as e:  # noqa: BLE001 - a template's own bug (e.g. a TypeError in an expression)
        raise ChatTemplateError(f"chat template {name} failed: {type(e).__name__}: {e}") from None


@lru_cache(maxsize=16)
def literal_text(source: str) -> str:
    """A template's raw text and string constants, joined with NULs (an added token found there is one of the
    template's control tokens, as transformers infers them)."""
    template = compile_template(source)
    ast = template.environment.parse(source)
    literals = {node.data for node in ast.find_all(jinja2.nodes.TemplateData)}
    literals |= {node.value for node in ast.find_all(jinja2.nodes.Const) if isinstance(node.value, str)}
    return "\0".join(sorted(literals))


@lru_cache(maxsize=16)
def control_patterns(control_tokens: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """A regex of the control tokens (longest first), and one that splits a rendered chat at marked tokens (the
    token captured) and at lone markers."""
    longest_first = sorted(control_tokens, key=len, reverse=True)
    tokens = re.compile("|".join(map(re.escape, longest_first)) or "(?!)")
    return tokens, re.compile(f"{MARK_START}({tokens.pattern}){MARK_END}|[{MARK_START}{MARK_END}]")


def mark(value: Any, tokens: re.Pattern[str]) -> Any:
    """``value`` (strings, lists and dicts of them) with each control token wrapped in the markers; markers already
    there are dropped first (no forging a marked token). Dict keys are left as they are."""
    if isinstance(value, str):
        value = value.replace(MARK_START, "").replace(MARK_END, "")
        return tokens.sub(f"{MARK_START}\\g<0>{MARK_END}", value)
    if isinstance(value, dict):
        return {k: mark(v, tokens) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mark(v, tokens) for v in value]
    return value
