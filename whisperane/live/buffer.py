"""One decoding of a stream's audio buffer (under 30 s): the seek loop's single-window step, so the buffer
gets the filters a file gets (temperature fallback, the no-speech rule, word timestamps from the alignment
heads, word edges moved out of silence)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..audio import HOP_LENGTH, N_FRAMES, AudioStream
from ..longform.guard import VoiceRegions
from ..longform.seek import SeekLoop
from ..longform.window import Window
from ..options import TranscribeOptions
from ..result import Word
from ..runtime.decoder_adapters import CrossAttention
from ..runtime.model import WhisperaneModel
from ..tokenizer import Tokenizer


@dataclass(frozen=True)
class BufferDecoding:
    """The words of one decoding (times from the buffer's start) and which of them end a segment."""

    words: tuple[Word, ...]
    segment_ends: frozenset[int]  # indices into ``words`` of each segment's last word


def encode_buffer(model: WhisperaneModel, samples: np.ndarray) -> CrossAttention:
    """The encoding of ``samples`` (at most 30 s) as one window."""
    return model.encode(model.log_mel(samples))


def decode_buffer(model: WhisperaneModel, samples: np.ndarray, enc: CrossAttention, options: TranscribeOptions,
                  tokenizer: Tokenizer, prompt: str, voiced: list[tuple[int, int]] | None = None) -> BufferDecoding:
    """Decode ``samples`` (at most 30 s; ``enc`` its encoding) as one window, prompted with ``prompt`` (the
    text before the buffer). ``voiced``: the buffer's voiced runs (mel frames): words are kept only where there
    is voice (longform.voiced), as in a file's default mode; the next update decodes the buffer again, so a
    window is never decoded twice here."""
    size = min(N_FRAMES, len(samples) // HOP_LENGTH)
    if size == 0:
        return BufferDecoding((), frozenset())
    voice = VoiceRegions(voiced) if voiced is not None else None
    loop = SeekLoop(model, AudioStream.from_array(samples, name="<stream>"), options, None, voice, voiced_words=True)
    loop.resumed.add(0)  # the one window: checked, never decoded again
    loop.begin(tokenizer, None, previous_text=tokenizer.encode(" " + prompt.strip()) if prompt.strip() else [])
    with model.in_use():
        loop.finish_window(Window(0, size, enc, samples))
    words: list[Word] = []
    ends: set[int] = set()
    for segment in loop.all_segments:
        for w in segment.get("words") or []:
            words.append(Word(w["word"], float(w["start"]), float(w["end"]), round(float(w["probability"]), 4)))
        if words:
            ends.add(len(words) - 1)
    return BufferDecoding(tuple(words), frozenset(ends))
