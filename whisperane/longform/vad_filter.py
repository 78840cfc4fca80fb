"""``vad_filter``: the seek loop over the speech Silero VAD finds, its times put back on the original audio."""

from __future__ import annotations

from collections.abc import Generator

from ..options import TranscribeOptions
from ..result import TranscriptionResult, result_from_segments
from ..runtime.model import WhisperaneModel
from ..vad.regions import VadOptions
from ..vad.stream import speech_stream
from .seek import SeekLoop, WindowDone, empty_result
from .words import restore_timestamps

BATCHED_VAD = {"max_speech_duration_s": 30.0}  # regions of at most 30 s: lanes are cut at their edges


def vad_options(options: TranscribeOptions, batched: bool) -> VadOptions:
    values = {**(BATCHED_VAD if batched else {}), **(options.vad_parameters or {})}
    return VadOptions(**values)


def speech_windows(model: WhisperaneModel, audio, options: TranscribeOptions) -> Generator[WindowDone, None,
                                                                                          TranscriptionResult]:
    """vad_filter: the seek loop over the speech alone (with the speech guard), window by window; returns the
    result, its times put back on the original audio."""
    vad = vad_options(options, batched=False)
    with speech_stream(audio, vad) as stream:
        duration = stream.original_duration
        if stream.n_samples == 0:
            return empty_result(model, options, duration)
        loop = SeekLoop.over_speech(model, stream, options)
        yield from loop
        segments = restore_timestamps(loop.segments, stream.time_map, stream.probabilities >= vad.threshold)
        tokenizer, language_probs = loop.language.of(None)
        return result_from_segments(segments, tokenizer, duration, language_probs, options.word_timestamps)
