"""``vad_filter``: the seek loop over the speech Silero VAD finds, its times put back on the original audio."""

from __future__ import annotations

from ..options import TranscribeOptions
from ..result import TranscriptionResult, result_from_segments
from ..runtime.model import WhisperaneModel
from ..vad.regions import VadOptions
from ..vad.stream import speech_stream
from .seek import SeekLoop, empty_result
from .words import restore_timestamps

BATCHED_VAD = {"max_speech_duration_s": 30.0}  # regions of at most 30 s: lanes are cut at their edges


def vad_options(options: TranscribeOptions, batched: bool) -> VadOptions:
    values = {**(BATCHED_VAD if batched else {}), **(options.vad_parameters or {})}
    return VadOptions(**values)


def transcribe_speech(model: WhisperaneModel, audio, options: TranscribeOptions, progress,
                      on_segment=None) -> TranscriptionResult:
    """vad_filter: the seek loop over the speech alone (with the speech guard), its times put back on the
    original audio."""
    vad = vad_options(options, batched=False)
    with speech_stream(audio, vad) as stream:
        duration = stream.original_duration
        if stream.n_samples == 0:
            return empty_result(model, options, duration)
        loop = SeekLoop.over_speech(model, stream, options, progress, on_segment=on_segment)
        loop.run_windows()
        segments = restore_timestamps(loop.segments, stream.time_map, stream.probabilities >= vad.threshold)
        return result_from_segments(segments, loop.tokenizer, duration, loop.language_probs, options.word_timestamps)
