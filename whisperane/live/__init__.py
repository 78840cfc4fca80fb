"""Live transcription: confirmed and hypothesis text from audio as it arrives.

A ``LiveTranscriber`` (``LiveTranscriber(model, **options)``) takes audio through ``feed()`` and ends with ``finish()``;
each update decodes the unconfirmed buffer again and confirms the words two consecutive decodings agree on
(LocalAgreement-2). ``stream()`` drives one over a path, a binary file object of raw PCM or an iterable of
float32 chunks. The server (one stream per connection) uses the same push interface.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator

import numpy as np

from ..runtime.model import WhisperaneModel
from .chunks import SimulatedClock, WallClock, file_chunks, paced, pcm_chunks
from .engine import LiveOptions, LiveTranscriber
from .events import EVENT_TYPES, StreamEvent


def stream(source: str | os.PathLike | io.RawIOBase | io.BufferedIOBase | Iterable[np.ndarray],
           model: str | os.PathLike | WhisperaneModel = "tiny.en", *, realtime: bool = False,
           clock: WallClock | None = None, pcm_format: str = "s16le", sample_rate: int = 16000,
           **options) -> Iterator[StreamEvent]:
    """The events of a stream over ``source``: an audio file's path, a binary file object of raw mono PCM
    (``pcm_format`` s16le or f32le at ``sample_rate``), or an iterable of float32 16 kHz chunks (each fed as
    it comes). A path is read in chunks of ``min_chunk`` seconds, as fast as it decodes, or with ``realtime``
    as if live (``clock``: a WallClock by default, a SimulatedClock to simulate at compute speed).
    ``options``: TranscribeOptions and LiveOptions fields."""
    if not isinstance(model, WhisperaneModel):
        from ..transcribe import shared_model

        model = shared_model(model)
    clock = clock or WallClock()
    transcriber = LiveTranscriber(model, clock=clock.now, **options)
    step = transcriber.live.min_chunk
    if isinstance(source, (str, os.PathLike)):
        chunks = file_chunks(source, step)
        chunks = paced(chunks, clock, step) if realtime else chunks
    elif hasattr(source, "read"):
        chunks = pcm_chunks(source, pcm_format, sample_rate, step)
    else:
        chunks = (np.asarray(c, dtype=np.float32) for c in source)
    for chunk in chunks:
        yield from transcriber.feed(chunk)
    yield from transcriber.finish()


__all__ = ["EVENT_TYPES", "LiveOptions", "LiveTranscriber", "SimulatedClock", "StreamEvent", "WallClock", "stream"]
