"""One decoding of a stream's audio buffer (under 30 s): the seek loop's single-window step, so the buffer
gets the filters a file gets (temperature fallback, the no-speech rule, word timestamps from the alignment
heads, word edges moved out of silence)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..audio import HOP_LENGTH, N_FRAMES, AudioStream
from ..model import EncodedWindow, WhisperaneModel
from ..options import TranscribeOptions
from ..tokenizer import Tokenizer
from ..transcribe import Transcription, Window, Word


@dataclass(frozen=True)
class BufferDecoding:
    """The words of one decoding (times from the buffer's start) and which of them end a segment."""

    words: tuple[Word, ...]
    segment_ends: frozenset[int]  # indices into ``words`` of each segment's last word


def encode_buffer(model: WhisperaneModel, samples: np.ndarray) -> EncodedWindow:
    """The encoding of ``samples`` (at most 30 s) as one window."""
    return model.encode(model.log_mel(samples))


def decode_buffer(model: WhisperaneModel, samples: np.ndarray, enc: EncodedWindow, options: TranscribeOptions,
                  tokenizer: Tokenizer, prompt: str) -> BufferDecoding:  # fmt: skip
    """Decode ``samples`` (at most 30 s; ``enc`` its encoding) as one window, prompted with ``prompt`` (the
    text before the buffer)."""
    size = min(N_FRAMES, len(samples) // HOP_LENGTH)
    if size == 0:
        return BufferDecoding((), frozenset())
    loop = Transcription(model, AudioStream.from_array(samples, name="<stream>"), options, None)
    loop.begin(tokenizer, None)
    loop.all_tokens[:] = tokenizer.encode(" " + prompt.strip()) if prompt.strip() else []
    loop.finish_window(Window(0, size, enc, samples))
    words: list[Word] = []
    ends: set[int] = set()
    for segment in loop.all_segments:
        for w in segment.get("words") or []:
            words.append(Word(w["word"], float(w["start"]), float(w["end"]), round(float(w["probability"]), 4)))
        if words:
            ends.add(len(words) - 1)
    return BufferDecoding(tuple(words), frozenset(ends))
