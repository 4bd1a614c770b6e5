"""npurt.speech's decoding rules without a model: Whisper's logit rules (suppression, timestamps), segments cut at
timestamp pairs as transformers' ``_retrieve_segment`` cuts them, the fallback's thresholds, prompts."""

from __future__ import annotations

import numpy as np
import pytest

from npurt.speech.decoding import DecodeSettings, LogitRules, compression_ratio
from npurt.speech.tokens import SpecialTokens
from npurt.speech.windows import Fallback, cut_segments

EOT, SOT, NO_TS = 50256, 50257, 50362
TS = NO_TS + 1  # <|0.00|>
VOCAB = TS + 1501

TOKENS = SpecialTokens(sot=SOT, eot=EOT, no_timestamps=NO_TS, transcribe=50358, translate=50357, prev_sot=50360,
                       no_speech=50361, multilingual=False, suppress=(1, 2, 50357), begin_suppress=(220, EOT),
                       max_initial_timestamp_index=50, vocab_size=VOCAB)


def _text(ids: object) -> str:
    return " ".join(str(t) for t in ids if t < EOT)  # type: ignore[attr-defined]


def test_prompts() -> None:
    assert TOKENS.prompt(None, "transcribe", False) == [SOT, NO_TS]
    assert TOKENS.prompt("en", "transcribe", True) == [SOT]
    assert TOKENS.prompt(None, "transcribe", False, [11, 12]) == [50360, 11, 12, SOT, NO_TS]
    long = list(range(300))
    assert TOKENS.prompt(None, "transcribe", False, long)[1:224] == long[-223:]  # at most half the context
    with pytest.raises(ValueError, match="English-only"):
        TOKENS.prompt(None, "translate", False)
    multi = SpecialTokens(sot=SOT, eot=EOT, no_timestamps=NO_TS, transcribe=50359, translate=50358, prev_sot=50361,
                          no_speech=50362, multilingual=True, languages={"en": 50259, "de": 50261})
    assert multi.prompt("german", "translate", False) == [SOT, 50261, 50358, NO_TS]
    with pytest.raises(ValueError, match="not one this model knows"):
        multi.prompt("xx", "transcribe", False)


def test_suppression_and_begin_suppression() -> None:
    rules = LogitRules(TOKENS, DecodeSettings(), VOCAB)
    scores = np.zeros((1, VOCAB), np.float32)
    rules.mask(scores, [[]])
    assert np.isneginf(scores[0, [1, 2, 50357, 220, EOT]]).all() and scores[0, 3] == 0
    scores = np.zeros((1, VOCAB), np.float32)
    rules.mask(scores, [[464]])  # past the first position: the blank and the end are allowed again
    assert np.isneginf(scores[0, [1, 2, 50357]]).all() and scores[0, 220] == 0 and scores[0, EOT] == 0


def test_timestamp_rules() -> None:
    rules = LogitRules(TOKENS, DecodeSettings(timestamps=True), VOCAB)
    first = np.zeros((1, VOCAB), np.float32)
    rules.mask(first, [[]])
    allowed = np.flatnonzero(np.isfinite(first[0]))
    assert allowed.min() == TS and allowed.max() == TS + 50  # a timestamp of at most 1 s first
    after_one = np.zeros((1, VOCAB), np.float32)
    after_one[0, [464, EOT]] = 10.0  # text and the end far likelier than the timestamps together
    rules.mask(after_one, [[TS + 3, 464, TS + 10]])  # a single timestamp closes a segment: its pair, or the end
    finite = np.flatnonzero(np.isfinite(after_one[0]))
    assert finite.min() == EOT and 464 not in finite and TS + 9 not in finite and TS + 10 in finite
    after_pair = np.zeros((1, VOCAB), np.float32)
    rules.mask(after_pair, [[TS + 3, 464, TS + 10, TS + 10]])  # after a pair: text next
    assert np.isneginf(after_pair[0, TS:]).all() and after_pair[0, 464] == 0
    likely = np.zeros((1, VOCAB), np.float32)
    likely[0, TS + 20:TS + 400] = 5.0  # timestamps together likelier than any text token: a timestamp is forced
    rules.mask(likely, [[TS, 464]])
    assert np.isneginf(likely[0, :TS]).all() and np.isneginf(likely[0, NO_TS])


def test_segments_cut_at_timestamp_pairs() -> None:
    a, b, c = 464, 2068, 7586
    # ends on a single timestamp: the last segment runs to it, the next window starts after this one
    segments, advance = cut_segments([TS, a, b, TS + 5, TS + 5, c, TS + 9], 2.0, 3000, TOKENS, _text)
    assert [(s.start, s.end, s.text) for s in segments] == [(2.0, 2.1, f"{a} {b}"), (2.1, 2.18, str(c))]
    assert advance == 3000
    # ends on a pair: the next window starts at its timestamp (2 frames a step)
    segments, advance = cut_segments([TS, a, TS + 5, TS + 5, b, TS + 9, TS + 9], 0.0, 3000, TOKENS, _text)
    assert [(s.start, s.end) for s in segments] == [(0.0, 0.1), (0.1, 0.18)]
    assert segments[1].ids == (TS + 5, b, TS + 9, TS + 9)
    assert advance == 18
    # no timestamps: one segment over the window
    segments, advance = cut_segments([a, b], 30.0, 1234, TOKENS, _text)
    assert [(s.start, s.end, s.ids) for s in segments] == [(30.0, pytest.approx(42.34), (a, b))]
    assert advance == 1234


def test_fallback_thresholds() -> None:
    assert compression_ratio("the same words " * 40) > 2.4
    assert compression_ratio("Can you tell me where the nearest train station is?") < 2.4
    from npurt.speech.decoding import WindowResult

    fallback = Fallback((0.0, 0.2))
    sure = WindowResult([1], -0.5, -0.2, 0.1, 0.0)
    unsure = WindowResult([1], -9.0, -3.0, 0.9, 0.0)
    assert not fallback.needs_fallback(sure, "a sentence that is fine")
    assert fallback.needs_fallback(unsure, "a sentence that is fine")
    assert fallback.needs_fallback(sure, "again and again " * 30)
    assert fallback.is_silence(unsure) and not fallback.is_silence(sure)
