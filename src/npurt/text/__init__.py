"""Text in, text out (issue 44): the model folder's tokenizer and chat template (``Tokenizer``), streaming text
(``DecodeStream``, ``StopStrings``), text generation over a ``Generator`` (``generate_text``, ``stream_text``) and
conversations that keep their cache (``ChatSession``). A layer above ``npurt.generate``: the runner and the
Generator know nothing of text.

Needs the extra ``text`` (HF ``tokenizers``, jinja2), imported where a tokenizer is made or a template rendered:
importing this package costs neither.
"""

from .chat import ChatSession
from .errors import ChatTemplateError, ContextFullError, NoTokenizerError
from .generation import TextResult, TextStream, generate_text, stream_text
from .stream import DecodeStream, StopStrings
from .tokenizer import Tokenizer

__all__ = ["ChatSession", "ChatTemplateError", "ContextFullError", "DecodeStream", "NoTokenizerError", "StopStrings",
           "TextResult", "TextStream", "Tokenizer", "generate_text", "stream_text"]
