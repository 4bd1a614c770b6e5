"""Speech to text (issue 58): ``Transcriber`` runs a Whisper export (optimum's folder) on any npurt backend.

One concept per module, imports pointing down: ``audio`` (files and samples in, 16 kHz mono out), ``features``
(log-mel as transformers computes it), ``tokens`` (special tokens and prompts), ``model`` (the encoder and the
decoder's runners and caches), ``decoding`` (one window: greedy, sampling, beam search, Whisper's logit rules),
``windows`` (long audio: seeking by timestamps, the temperature fallback), ``vad`` (silero-vad), ``transcriber``.

Needs the extra ``speech`` (soundfile, soxr, tokenizers), imported where used: importing this package costs none.
"""

from .audio import AudioError
from .transcriber import DEFAULT_FALLBACK, Transcriber, Transcription
from .windows import Segment

__all__ = ["DEFAULT_FALLBACK", "AudioError", "Segment", "Transcriber", "Transcription"]
