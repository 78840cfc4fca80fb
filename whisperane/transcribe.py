"""The entry point: ``transcribe(audio, model, **options)``, openai-whisper's signature and result, and the model
users load (``load_model``: a ``WhisperaneModel`` with openai-whisper's ``model.transcribe``). The stages it runs
live in ``whisperane.longform``: the seek loop (sequential), ``vad_filter``'s loop over the speech, and batched
mode's lanes. This module sits above the loader and the runtime: neither imports it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import fields

import numpy as np

from .audio import N_SAMPLES, AudioStream, open_audio
from .errors import OptionsError
from .loading import open_model
from .longform.seek import SeekLoop, WindowDone
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
    it for all segments at the end). ``Transcription`` is the same run as an iterator of its windows.
    """
    unknown = set(kwargs) - {f.name for f in fields(TranscribeOptions)}
    if unknown:
        raise TypeError(f"unknown transcribe option(s): {', '.join(sorted(unknown))}")
    options = TranscribeOptions(language=language, task=task, word_timestamps=word_timestamps, **kwargs)
    if not isinstance(model, WhisperaneModel):
        model = shared_model(model)
    return transcribe_with(model, audio, options, progress, on_segment)


def transcribe_with(model: WhisperaneModel, audio: str | os.PathLike | np.ndarray | AudioStream,
                    options: TranscribeOptions, progress: Callable[[float, float], None] | None = None,
                    on_segment: Callable[[Segment], None] | None = None) -> TranscriptionResult:
    """``transcribe()`` with its options already built (a server's request, the CLI's flags): the same run."""
    transcription = Transcription(model, audio, options)
    for window in transcription:
        for segment in window.segments if on_segment else ():
            on_segment(segment)
        if progress:
            progress(window.done, window.duration)
    return transcription.result


class Transcription:
    """One transcription as an iterator of its windows (``WindowDone``: the segments each kept, how far it has
    come), as faster-whisper's ``generate_segments``: the caller sets the pace and cancels by stopping (the audio is
    closed however the iteration ends); ``result`` once it has run to the end. The options are checked against the
    model, and a source diarize must read twice opened again, at once."""

    def __init__(self, model: WhisperaneModel, audio: str | os.PathLike | np.ndarray | AudioStream,
                 options: TranscribeOptions):
        check_options_for_model(options, model.is_multilingual)
        if (options.batch_size is not None or options.multilingual) and isinstance(audio, AudioStream):
            raise OptionsError("batched and multilingual modes read the audio twice (VAD, then speech): pass a path "
                               "or an array")
        self.model, self.audio, self.options = model, audio, options
        self.result: TranscriptionResult | None = None
        self._open_again = self._references = None
        if options.diarize:
            from .diarize.pipeline import known_speaker_embeddings, stream_opener  # only when asked for

            self._open_again = stream_opener(audio)  # a stream read only once is refused here, at once
            if options.known_speakers:  # a bad reference clip too
                self._references = known_speaker_embeddings(options.known_speakers)

    def __iter__(self) -> Iterator[WindowDone]:
        result = yield from self._windows()
        if self._open_again is not None:
            from .diarize.pipeline import diarize
            from .diarize.words import with_speakers

            # after the transcription, on this thread (it embeds the transcript's words and the VAD's speech):
            # beside the transcription on a thread of its own it costs the decoder loop more than its own time
            turns = diarize(self._open_again, result, self.options.speaker_count, references=self._references)
            result = with_speakers(result, turns, self.model.tokenizer(result.language, self.options.task))
        self.result = result

    def _speaker_changes(self) -> tuple[int, ...]:
        """With diarize, where the speaker changes (samples), found from the voices before decoding: multilingual
        then never decodes two speakers as one stretch of one language, however short the pause between them."""
        if self._open_again is None:
            return ()
        from .diarize.pipeline import speaker_changes

        return speaker_changes(self._open_again, self.options.speaker_count)

    def _windows(self) -> Generator[WindowDone, None, TranscriptionResult]:
        """Batched mode, the VAD-filtered loop or the default seek loop over the whole audio."""
        model, audio, options = self.model, self.audio, self.options
        if options.batch_size is not None:
            from .longform.lanes import batched_windows  # imports the VAD: only for the modes that run it

            return (yield from batched_windows(model, lambda: open_audio(audio), options))
        if options.multilingual:
            from .longform.multilingual import multilingual_windows  # imports the VAD: only for this mode

            return (yield from multilingual_windows(model, lambda: open_audio(audio), options, self._speaker_changes()))
        if options.vad_filter:
            from .longform.vad_filter import speech_windows

            return (yield from speech_windows(model, audio, options))
        guard = SpeechGuard.on_demand() if options.speech_guard else None
        stream = audio if isinstance(audio, AudioStream) else open_audio(audio)
        try:
            # a stream given by the caller can be read once: its windows keep their own peaks
            peak = None if stream is audio else _file_peak(model, audio, stream)
            loop = SeekLoop(model, stream, options, guard, peak)
            yield from loop
            return loop.result()
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


class Whisper(WhisperaneModel):
    """A loaded model that transcribes, as openai-whisper's and faster-whisper's: ``model.transcribe(audio)``."""

    def transcribe(self, audio: str | os.PathLike | np.ndarray | AudioStream, **options) -> TranscriptionResult:
        """``whisperane.transcribe(audio, model=self, **options)``."""
        return transcribe(audio, model=self, **options)


def load_model(name_or_path: str | os.PathLike = "tiny.en", executor: str = "onnx", threads: int | None = None,
               compute_units: str = "ALL", compute_type: str = "default", **kwargs) -> Whisper:
    """A model by name (converted on first use) or bundle directory, ready to transcribe: ``loading.open_model``'s
    arguments (``verify``, ``encoder_threads``, ``wrap``: what its components are wrapped in)."""
    return open_model(name_or_path, executor, threads, compute_units, compute_type, model_class=Whisper, **kwargs)


_LOADED: dict[tuple, Whisper] = {}
_LOADED_LOCK = threading.Lock()


def shared_model(name_or_path: str | os.PathLike, executor: str = "onnx", compute_type: str = "default") -> Whisper:
    """A model loaded once per (name or path, executor, compute type) and reused by later calls, as
    ``transcribe(model="tiny.en")`` needs: loading costs more than a short file's transcription."""
    key = (os.fspath(name_or_path), executor, compute_type)
    with _LOADED_LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_model(name_or_path, executor=executor, compute_type=compute_type)
        return _LOADED[key]


__all__ = ["Segment", "TranscribeOptions", "Transcription", "TranscriptionResult", "Whisper", "WindowDone", "Word", "load_model", "shared_model",
           "transcribe", "transcribe_with"]
