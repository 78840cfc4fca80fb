"""The entry point: ``transcribe(audio, model, **options)``, openai-whisper's signature and result. The stages it
runs live in ``whisperane.longform``: the seek loop (sequential), ``vad_filter``'s loop over the speech, and
batched mode's lanes."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import fields

import numpy as np

from .audio import N_SAMPLES, AudioStream, open_audio
from .errors import OptionsError
from .longform.seek import SeekLoop
from .longform.speech_guard import SpeechGuard
from .options import TranscribeOptions, check_options_for_model
from .result import Segment, TranscriptionResult, Word
from .runtime.model import WhisperaneModel


def transcribe(
    audio: str | os.PathLike | np.ndarray | AudioStream,
    model: str | os.PathLike | WhisperaneModel = "tiny.en",
    language: str | None = None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    progress: Callable[[float, float], None] | None = None,
    on_segment: Callable[[Segment], None] | None = None,
    **kwargs,
) -> TranscriptionResult:
    """Transcribe a file path, a 16 kHz mono float array or an open AudioStream.

    ``kwargs`` are the fields of :class:`TranscribeOptions` (an unknown name is a TypeError; an invalid value
    an OptionsError). A model name or path is loaded once and reused by later calls. ``progress(seconds_done,
    duration)`` is called after each window; ``on_segment(segment)`` with each segment as its window is kept, in
    order (text final; times on the audio the loop reads: the speech alone under vad_filter; batched mode calls
    it for all segments at the end).
    """
    unknown = set(kwargs) - {f.name for f in fields(TranscribeOptions)}
    if unknown:
        raise TypeError(f"unknown transcribe option(s): {', '.join(sorted(unknown))}")
    options = TranscribeOptions(language=language, task=task, word_timestamps=word_timestamps, **kwargs)
    if not isinstance(model, WhisperaneModel):
        from .loading import shared_model  # imports the runtime's sessions only when a name is given

        model = shared_model(model)
    check_options_for_model(options, model.is_multilingual)
    if not options.diarize:
        return _transcribe_in_mode(model, audio, options, progress, on_segment)
    from .diarize.pipeline import diarize, stream_opener  # the speaker encoder: only when asked for
    from .diarize.words import with_speakers

    open_again = stream_opener(audio)  # before the transcription: a stream read only once is refused at once
    result = _transcribe_in_mode(model, audio, options, progress, on_segment)
    # after it, on this thread: the transcript's words are the speech to embed (no VAD pass of its own), and beside
    # the transcription on a thread of its own it costs the decoder loop more than its own time
    # (benchmarks/results/2026-12-06-session34-diarize.md)
    turns = diarize(open_again, result, options.speaker_count)
    return with_speakers(result, turns, model.tokenizer(result.language, options.task))


def _transcribe_in_mode(model: WhisperaneModel, audio: str | os.PathLike | np.ndarray | AudioStream,
                        options: TranscribeOptions, progress: Callable[[float, float], None] | None,
                        on_segment: Callable[[Segment], None] | None) -> TranscriptionResult:
    """Batched mode, the VAD-filtered loop or the default seek loop over the whole audio."""
    if options.batch_size is not None:
        from .longform.lanes import transcribe_batched  # imports the VAD: only for the modes that run it

        if isinstance(audio, AudioStream):
            raise OptionsError("batched mode reads the audio twice (VAD, then chunks): pass a path or an array")
        result = transcribe_batched(model, lambda: open_audio(audio), options, progress)
        for segment in result.segments if on_segment else ():
            on_segment(segment)
        return result
    if options.vad_filter:
        from .longform.vad_filter import transcribe_speech

        return transcribe_speech(model, audio, options, progress, on_segment)
    guard = SpeechGuard.on_demand() if options.speech_guard else None
    stream = audio if isinstance(audio, AudioStream) else open_audio(audio)
    try:
        # a stream given by the caller can be read once: its windows keep their own peaks
        peak = None if stream is audio else _file_peak(model, audio, stream)
        return SeekLoop(model, stream, options, progress, guard, peak, on_segment).run()
    finally:
        if stream is not audio:
            stream.close()


def _file_peak(model: WhisperaneModel, audio: str | os.PathLike | np.ndarray, stream: AudioStream) -> float | None:
    """The whole file's log-mel peak (openai's floor), read before the loop reads ``stream``; None for one window
    (<= 30 s), whose own peak is the file's. Audio in memory (an array) is read from ``stream``
    itself, which serves any read; a file is opened a second time for it."""
    if stream.n_samples <= N_SAMPLES:
        return None
    if stream.in_memory:
        return model.mel_peak(stream)
    with open_audio(audio) as first_pass:
        return model.mel_peak(first_pass)


__all__ = ["Segment", "TranscribeOptions", "TranscriptionResult", "Word", "transcribe"]
