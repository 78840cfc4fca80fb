"""One decoding of a stream's audio buffer (under 30 s): the seek loop's window step, so the buffer gets the
filters a file gets (the no-speech rule, word timestamps from the alignment heads, word edges moved out of
silence), but decoded within a budget instead of through openai's whole temperature fallback."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE
from ..language import LanguageChoice
from ..longform.speech_guard import SpeechGuard
from ..longform.step import UNDECODED, DecodeBudget, WindowStep
from ..longform.window import Window
from ..options import TranscribeOptions
from ..result import Word
from ..runtime.decoder_adapters import CrossAttention
from ..runtime.model import WhisperaneModel
from ..timing import is_punctuation_only
from ..tokenizer import Tokenizer

# An update never runs openai's whole fallback (six temperatures, best-of-5 sampling from the second: seconds with
# nothing on screen): it tries the first two, each with at most this many tokens a second of buffer (past any speech
# rate, timestamps included) and MIN_TOKENS, a loop cut where it starts (longform.step.DecodeBudget).
TOKENS_PER_SECOND = 12
MIN_TOKENS = 32


@dataclass(frozen=True)
class BufferDecoding:
    """The words of one decoding (times from the buffer's start) and which of them end a segment; ``decoded``:
    False where the decoding failed openai's checks within its budget (no words: the audio is decoded again)."""

    words: tuple[Word, ...]
    segment_ends: frozenset[int]  # indices into ``words`` of each segment's last word
    decoded: bool = True


def encode_buffer(model: WhisperaneModel, samples: np.ndarray) -> CrossAttention:
    """The encoding of ``samples`` (at most 30 s) as one window."""
    return model.encode(model.log_mel(samples))


def decode_buffer(model: WhisperaneModel, samples: np.ndarray, enc: CrossAttention, options: TranscribeOptions,
                  tokenizer: Tokenizer, prompt: str, voiced: list[tuple[int, int]] | None = None) -> BufferDecoding:
    """Decode ``samples`` (at most 30 s; ``enc`` its encoding) as one window, prompted with ``prompt`` (the
    text before the buffer). ``voiced``: the buffer's voiced runs (mel frames): words are kept only where there
    is voice (the speech guard's checks of words), as in a file's default mode; the next update decodes the buffer
    again, so the guard never decodes it again here."""
    size = min(N_FRAMES, len(samples) // HOP_LENGTH)
    if size == 0:
        return BufferDecoding((), frozenset())
    guard = SpeechGuard.of_voiced_frames(voiced) if voiced is not None else None
    step = WindowStep(model, options, LanguageChoice.of_tokenizer(model, tokenizer), guard)
    previous_text = tokenizer.encode(" " + prompt.strip()) if prompt.strip() else []
    window, content_frames = Window(0, size, enc, samples), len(samples) // HOP_LENGTH
    budget = DecodeBudget(max_tokens=update_tokens(len(samples)))
    outcome = step(window, previous_text, 0, may_resume=False, last_speech=0.0, content_frames=content_frames,
                   audio_end=window.audio_end(content_frames, len(samples)), budget=budget)
    if outcome.reason == UNDECODED:
        return BufferDecoding((), frozenset(), decoded=False)
    words: list[Word] = []
    ends: set[int] = set()
    for segment in outcome.segments:
        words.extend(replace(w, probability=round(w.probability, 4)) for w in segment.words or () if not is_punctuation_only(w.word))
        if words:
            ends.add(len(words) - 1)
    return BufferDecoding(tuple(words), frozenset(ends))


def update_tokens(n_samples: int) -> int:
    """The most tokens one update samples for a buffer of ``n_samples``."""
    return MIN_TOKENS + round(TOKENS_PER_SECOND * n_samples / SAMPLE_RATE)
