"""One window's decoding: greedy, sampling (best of n) and beam search over a ``WhisperModel``, with Whisper's logit
rules, as transformers' ``WhisperForConditionalGeneration.generate`` (4.57) and openai-whisper apply them.

The rules, in their order (``mask``): ``suppress_tokens`` (-inf), then at the first sampled position
``begin_suppress_tokens`` (the blank and ``<|endoftext|>``), then with timestamps openai-whisper's
``ApplyTimestampRules`` (transformers' ``WhisperTimeStampLogitsProcessor``): ``<|notimestamps|>`` never; timestamps
in pairs, never decreasing; the first token a timestamp of at most ``max_initial_timestamp_index``; a timestamp
forced where their total probability beats every text token's.

- Greedy: the argmax of the masked logits (CTranslate2's and transformers' greedy).
- Beam search: transformers' (``num_beams``, ``length_penalty`` 1, ``early_stopping`` False): the masked log-softmax
  of each beam plus its score, the best ``2 * beams`` continuations; a continuation ending in ``<|endoftext|>`` among
  the first ``beams`` joins the finished ones scored by its sum over its length; the search stops when no running
  beam can beat the worst finished one at its current length.
- Sampling (a fallback temperature > 0): ``best_of`` rows drawn from ``softmax(logits / T)``, the best by mean
  log-probability, as openai-whisper does.

Log-probabilities for the fallback's thresholds are openai-whisper's: of the masked logits, the end token's
included, averaged over the tokens plus one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .decoder_cache import DecoderCache
from .model import WhisperModel
from .tokens import SpecialTokens

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class DecodeSettings:
    """How one window is decoded."""

    beam_size: int = 1
    best_of: int = 5  # rows sampled at a temperature > 0
    timestamps: bool = False
    suppress_blank: bool = True  # begin_suppress_tokens at the first position
    length_penalty: float = 1.0
    max_new_tokens: int | None = None  # default: the decoder's positions left after the prompt


@dataclass(frozen=True)
class WindowResult:
    """One window's decoded ids (no prompt, no ``<|endoftext|>``) and the numbers the fallback judges them by."""

    tokens: list[int]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float


def compression_ratio(text: str) -> float:
    """openai-whisper's: the text's UTF-8 length over its zlib-compressed length (repetitive text compresses)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def log_softmax(x: np.ndarray) -> np.ndarray:
    """float32 log-softmax over the last axis (rows of -inf stay -inf where masked)."""
    top = np.max(x, axis=-1, keepdims=True)
    shifted = x - top
    with np.errstate(under="ignore"):
        out: np.ndarray = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return out


class LogitRules:
    """Whisper's logit rules (see the module) for one window."""

    def __init__(self, tokens: SpecialTokens, settings: DecodeSettings, vocab: int) -> None:
        self.tokens = tokens
        self.timestamps = settings.timestamps
        self.suppress = np.array([t for t in tokens.suppress if 0 <= t < vocab], np.int64)
        self.begin = np.array([t for t in tokens.begin_suppress if 0 <= t < vocab] if settings.suppress_blank
                              else [], np.int64)

    def mask(self, scores: np.ndarray, sampled: Sequence[Sequence[int]]) -> None:
        """Apply the rules to ``scores`` [rows, vocab] in place; ``sampled[r]``: row r's ids after the prompt."""
        if self.suppress.size:
            scores[:, self.suppress] = NEG_INF
        first = len(sampled[0]) == 0
        if first and self.begin.size:
            scores[:, self.begin] = NEG_INF
        if self.timestamps:
            self._timestamp_rules(scores, sampled, first)

    def _timestamp_rules(self, scores: np.ndarray, sampled: Sequence[Sequence[int]], first: bool) -> None:
        begin, eot = self.tokens.timestamp_begin, self.tokens.eot
        scores[:, self.tokens.no_timestamps] = NEG_INF
        for k, seq in enumerate(sampled):
            last_was_timestamp = len(seq) >= 1 and seq[-1] >= begin
            penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= begin
            if last_was_timestamp:
                if penultimate_was_timestamp:  # a pair closed: text (or the end) next
                    scores[k, begin:] = NEG_INF
                else:  # a segment's end: its pair's second timestamp, or the end
                    scores[k, :eot] = NEG_INF
            stamps = [t for t in seq if t >= begin]
            if stamps:  # timestamps never decrease
                last = stamps[-1] if last_was_timestamp and not penultimate_was_timestamp else stamps[-1] + 1
                scores[k, begin:last] = NEG_INF
        if first:
            scores[:, :begin] = NEG_INF
            if self.tokens.max_initial_timestamp_index is not None:
                scores[:, begin + self.tokens.max_initial_timestamp_index + 1:] = NEG_INF
        logprobs = log_softmax(scores.astype(np.float32))
        for k in range(scores.shape[0]):
            row = logprobs[k, begin:]
            top = np.max(row)
            with np.errstate(under="ignore"):
                timestamp_logprob = top + np.log(np.sum(np.exp(row - top))) if np.isfinite(top) else top
            if timestamp_logprob > np.max(logprobs[k, :begin]):
                scores[k, :begin] = NEG_INF


def decode_window(model: WhisperModel, hidden: np.ndarray, prompt: Sequence[int], tokens: SpecialTokens,
                  settings: DecodeSettings, temperature: float = 0.0, rng: np.random.Generator | None = None,
                  on_token: Callable[[int], None] | None = None) -> WindowResult:
    """Decode one window (``hidden``: its encoder output) after ``prompt``. ``on_token`` sees each id of a greedy
    decode as it is chosen (beam search and sampling settle their ids at the end)."""
    logits, cache = model.prefill(hidden, prompt)
    try:
        no_speech = _no_speech_prob(logits, prompt, tokens)
        room = tokens.max_target_positions - len(prompt)
        limit = min(room, settings.max_new_tokens) if settings.max_new_tokens else room
        rules = LogitRules(tokens, settings, logits.shape[-1])
        first = np.array(logits[-1:], np.float32)
        if temperature > 0:
            rows = max(1, settings.best_of)
            ids, total = _sample(model, cache, first, rules, tokens.eot, limit, temperature, rows,
                                 rng or np.random.default_rng())
        elif settings.beam_size > 1:
            ids, total = _beam(model, cache, first, rules, tokens.eot, limit, settings.beam_size, len(prompt),
                               settings.length_penalty)
        else:
            ids, total = _greedy(model, cache, first, rules, tokens.eot, limit, on_token)
    finally:
        model.release(cache)  # (the stateful path's stream goes back to the model's pool)
    return WindowResult(ids, total, total / (len(ids) + 1), no_speech, temperature)


def _no_speech_prob(logits: np.ndarray, prompt: Sequence[int], tokens: SpecialTokens) -> float:
    if tokens.no_speech is None or tokens.sot not in prompt:
        return 0.0
    row = logits[list(prompt).index(tokens.sot)].astype(np.float64)
    probs = np.exp(row - row.max())
    return float(probs[tokens.no_speech] / probs.sum())


def _greedy(model: WhisperModel, cache: DecoderCache, scores: np.ndarray, rules: LogitRules, eot: int, limit: int,
            on_token: Callable[[int], None] | None) -> tuple[list[int], float]:
    ids: list[int] = []
    total = 0.0
    while True:
        rules.mask(scores, [ids])
        token = int(np.argmax(scores[0]))
        total += float(log_softmax(scores[0:1].astype(np.float64))[0, token])
        if token == eot:
            break
        ids.append(token)
        if on_token is not None:
            on_token(token)
        if len(ids) >= limit:
            break
        scores = np.array(model.step(cache, [token]), np.float32)
    return ids, total


def _sample(model: WhisperModel, cache: DecoderCache, first: np.ndarray, rules: LogitRules, eot: int, limit: int,
            temperature: float, rows: int, rng: np.random.Generator) -> tuple[list[int], float]:
    cache.select([0] * rows)
    scores = np.repeat(first, rows, axis=0)
    seqs: list[list[int]] = [[] for _ in range(rows)]
    totals = np.zeros(rows)
    done = np.zeros(rows, bool)
    while True:
        rules.mask(scores, seqs)
        logprobs = log_softmax(scores.astype(np.float64))
        probs = np.exp(log_softmax(scores.astype(np.float64) / temperature))
        picks = [int(rng.choice(len(p), p=p / p.sum())) if not done[r] else eot for r, p in enumerate(probs)]
        for r, token in enumerate(picks):
            if not done[r]:
                totals[r] += logprobs[r, token]
                if token == eot:
                    done[r] = True
                else:
                    seqs[r].append(token)
        if done.all() or max(len(s) for s in seqs) >= limit:
            break
        scores = np.array(model.step(cache, picks), np.float32)
    best = int(np.argmax([totals[r] / max(1, len(seqs[r])) for r in range(rows)]))
    return seqs[best], float(totals[best])


def _beam(model: WhisperModel, cache: DecoderCache, first: np.ndarray, rules: LogitRules, eot: int, limit: int,
          beams: int, prompt_len: int, length_penalty: float) -> tuple[list[int], float]:
    """transformers' beam search (``GenerationMixin._beam_search``, early_stopping False) for one sequence."""
    vocab = first.shape[-1]
    keep = 2 * beams  # continuations kept per step: max(2, 1 + the number of eos ids) * beams
    cache.select([0] * beams)
    logits = np.repeat(first, beams, axis=0)
    running: list[list[int]] = [[] for _ in range(beams)]
    running_scores = np.full(beams, -1e9, np.float32)
    running_scores[0] = 0.0
    finished: list[tuple[float, list[int], float]] = []  # (normalised score, ids, sum) best first, at most beams
    improvable = True
    generated = 0  # ids each running beam holds (cur_len - prompt_len)
    while True:
        logprobs = log_softmax(logits.astype(np.float32))
        rules.mask(logprobs, running)
        total = (logprobs + running_scores[:, None]).reshape(-1)
        top = np.argpartition(-total, keep)[:keep]
        top = top[np.argsort(-total[top], kind="stable")]
        cand_scores = total[top].astype(np.float32)
        parents, ids = top // vocab, top % vocab
        at_limit = generated + 1 >= limit
        hits = (ids == eot) | at_limit
        # the finished ones: among the first `beams` continuations, those that hit a stop, scored by length
        if improvable:
            length = float(generated + 1) ** length_penalty
            for rank in range(beams):
                if hits[rank] and np.isfinite(cand_scores[rank]):
                    seq = running[parents[rank]] + ([] if ids[rank] == eot else [int(ids[rank])])
                    finished.append((float(np.float32(cand_scores[rank] / np.float32(length))), seq,
                                     float(cand_scores[rank])))
            finished.sort(key=lambda f: -f[0])
            del finished[beams:]
        if hits.all():
            break
        alive = np.where(hits, np.float32(-1e9), np.float32(0)) + cand_scores
        chosen = np.argsort(-alive, kind="stable")[:beams]
        running = [running[parents[c]] + [int(ids[c])] for c in chosen]
        running_scores = alive[chosen].astype(np.float32)
        generated += 1
        if len(finished) == beams:  # no running beam can beat the worst finished one at its current length
            best_possible = float(running_scores[0]) / float(generated) ** length_penalty
            improvable = improvable and best_possible > min(f[0] for f in finished)
        if not improvable:
            break
        cache.select(parents[chosen])
        logits = np.array(model.step(cache, [int(ids[c]) for c in chosen]), np.float32)
    if not finished:
        return running[0], float(running_scores[0])
    return finished[0][1], finished[0][2]
