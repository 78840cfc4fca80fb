"""openai-whisper's seek loop over one audio stream (``SeekLoop``), an iterator of its windows: each window is one
``step.WindowStep`` (decode, words, the speech guard), whose outcome moves the loop on and is yielded to the
caller (``WindowDone``), who sets the pace and cancels by stopping. Audio is read through a bounded stream, so
memory does not grow with its length."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, AudioStream
from ..decoding import DecodingResult
from ..errors import WhisperaneError
from ..language import LanguageChoice
from ..options import TranscribeOptions
from ..prompts import window_prompt
from ..result import Segment, TranscriptionResult, result_from_segments, rounded
from ..runtime.model import WhisperaneModel
from ..tokenizer import Tokenizer
from .speech_guard import SpeechGuard
from .step import WindowOutcome, WindowStep
from .window import Window, clip_ranges, read_window

if TYPE_CHECKING:  # the VAD package is imported where it is used (vad_filter, batched mode)
    from ..vad.stream import SpeechStream


def empty_result(model: WhisperaneModel, options: TranscribeOptions, duration: float) -> TranscriptionResult:
    """The transcript of audio without speech: empty, not an error."""
    return result_from_segments([], model.tokenizer(options.language or "en", options.task), duration, None, options.word_timestamps)


@dataclass(frozen=True)
class WindowDone:
    """One window of a transcription as its caller sees it: the segments it kept, in order, as the result holds them
    (numbered, rounded; times on the audio the loop reads: the speech alone under vad_filter), and how far the
    transcription has come (seconds done of the audio's duration, which a stream may refine as it is read)."""

    segments: tuple[Segment, ...]
    done: float
    duration: float


@dataclass
class Position:
    """Where a loop is: the window's start (``seek``, mel frames), the clip of clip_timestamps, where the speech guard
    ends the next window (the voice it found without words, decoded alone), the windows decoded (each one's index
    seeds its sampling), the windows the guard started (never guarded again), the stream's length so far (mel
    frames) and the end of the last kept word (seconds)."""

    seek: int
    content_frames: int
    clip: int = 0
    window_end: int | None = None
    windows: int = 0
    resumed: set[int] = field(default_factory=set)
    last_speech: float = 0.0


@dataclass
class Prompt:
    """The text so far as the next window's prompt: every token kept (after the initial prompt or the text before
    this loop's audio), where it was last reset (no prompt after a high temperature, or where the guard decodes
    again), the initial prompt's tokens, and whether they start every window's prompt (carry_initial_prompt, in
    the decoder's n_text_ctx)."""

    tokens: list[int]
    initial: list[int]
    carry_initial: bool
    n_text_ctx: int
    reset_since: int = 0

    @property
    def current(self) -> list[int]:
        return window_prompt(self.tokens, self.reset_since, self.initial, self.carry_initial, self.n_text_ctx)


class SeekLoop:
    """openai-whisper's seek loop over one audio stream, as an iterator of ``WindowDone``: next window ->
    ``WindowStep`` -> advance. The call's model, options, language and speech guard (None: off) decide each window;
    the loop keeps only its position, its prompt and its segments. ``file_peak``: the whole file's log-mel peak
    (openai's floor; None: each window's own); ``previous_text``: the text before this loop's audio (decoded by
    another loop), else the initial prompt starts it. Batched mode steps several loops side by side with the same
    two calls the iteration makes (``next_window``, ``advance``), their windows encoded and decoded together."""

    def __init__(self, model: WhisperaneModel, stream: AudioStream, options: TranscribeOptions,
                 guard: SpeechGuard | None = None, file_peak: float | None = None,
                 language: LanguageChoice | None = None, previous_text: Sequence[int] | None = None):
        if stream.n_samples == 0:
            raise WhisperaneError(f"{stream.name}: the audio holds no samples")
        self.stream, self.options = stream, options
        self.language = language or LanguageChoice(model, options.language, options.task)
        self._step = WindowStep(model, options, self.language, guard)
        self._file_peak = file_peak
        # Total length: exact for arrays and wav/flac; from the header for mp3 (refined as the stream is read).
        content_frames = int(stream.n_samples // HOP_LENGTH)
        self._clips = clip_ranges(options.clip_timestamps, content_frames)
        self.position = Position(self._clips[0][0], content_frames)
        initial = []
        if options.initial_prompt:
            initial = model.tokenizer(options.language or "en", options.task).encode(" " + options.initial_prompt.strip())
        # previous_text is another loop's prompt: with carry_initial_prompt, it starts with the initial prompt
        tokens = list(previous_text) if previous_text is not None else [*initial]
        self.prompt = Prompt(tokens, initial, options.carry_initial_prompt, model.dims.n_text_ctx)
        self.segments: list[Segment] = []

    @classmethod
    def over_speech(cls, model: WhisperaneModel, stream: SpeechStream, options: TranscribeOptions,
                    voiced: Sequence | None = None, language: LanguageChoice | None = None,
                    previous_text: Sequence[int] | None = None) -> SeekLoop:
        """The loop over a VAD's speech alone (vad_filter, a lane of batched mode), the speech guard asking the
        voiced regions of the same VAD pass (``voiced``: VoiceRegions.of_speech)."""
        guard = SpeechGuard.over_speech(stream, voiced) if options.speech_guard else None
        return cls(model, stream, options, guard, language=language, previous_text=previous_text)

    def __iter__(self) -> Iterator[WindowDone]:
        first = self._language_window() if self.language.needs_audio else None
        while (window := self._read_next(first=first)) is not None:
            first = None
            yield self.advance(window)

    def result(self) -> TranscriptionResult:
        """The transcript of the windows decoded so far."""
        tokenizer, language_probs = self.language.of(None)
        return result_from_segments(self.segments, tokenizer, self.stream.n_samples / SAMPLE_RATE, language_probs,
                                    self.options.word_timestamps)

    def next_window(self) -> Window | None:
        """The next window with its log-mel, not encoded (for windows of several loops encoded and decoded
        together, then given back one by one to ``advance``); digital silence is passed over."""
        while (window := self._read_next(encode=False)) is not None and window.is_silence:
            self.advance(window)
        return window

    def advance(self, window: Window, first: DecodingResult | None = None) -> WindowDone:
        """Decode ``window`` (``first``: its result at the first temperature, decoded with other windows) and move
        on: what it kept."""
        p = self.position
        kept: tuple[Segment, ...] = ()
        if window.is_silence:
            p.seek = window.seek + window.size
        else:
            outcome = self._step(window, self.prompt.current, p.windows, may_resume=window.seek not in p.resumed,
                                 last_speech=p.last_speech, content_frames=p.content_frames,
                                 audio_end=window.audio_end(p.content_frames, self.stream.n_samples), first=first)
            p.windows += 1
            kept = self._keep(outcome)
        return WindowDone(kept, min(p.seek, p.content_frames) / FRAMES_PER_SECOND, p.content_frames / FRAMES_PER_SECOND)

    def ends_in_a_tail(self) -> bool:
        """Whether the next window would be the stream's last and not full, after at least one window of this loop
        (one the speech guard bounds is not: ``window_end``)."""
        p = self.position
        left = p.content_frames - p.seek
        return p.windows > 0 and p.window_end is None and 0 < left < N_FRAMES

    def _keep(self, outcome: WindowOutcome) -> tuple[Segment, ...]:
        p, kept = self.position, []
        for segment in outcome.segments:
            segment = replace(segment, id=len(self.segments))
            self.segments.append(segment)
            self.prompt.tokens.extend(segment.tokens)
            kept.append(rounded(segment, segment.id))
        if outcome.last_speech is not None:
            p.last_speech = outcome.last_speech
        if outcome.reset_prompt:  # no prompt after a high temperature, or where the guard decodes again
            self.prompt.reset_since = len(self.prompt.tokens)
        if outcome.resumed:
            p.resumed.add(outcome.seek)
        p.window_end, p.seek = outcome.window_end, outcome.seek
        return tuple(kept)

    def _language_window(self) -> Window:
        """The first frames of the audio, encoded, to detect the language on (openai's: from the audio's start,
        whatever the clips); the loop's first window reuses the encoding where it is the same window."""
        size = min(N_FRAMES, self.position.content_frames)
        window = Window(0, size, *read_window(self._step.model, self.stream, 0, size, self._file_peak))
        self.language.of(window.enc)
        return window

    def _read_next(self, encode: bool = True, first: Window | None = None) -> Window | None:
        """The window at ``seek`` (moving on to the next clip of clip_timestamps where one ends), or None."""
        p = self.position
        while p.clip < len(self._clips):
            self._refine_length()
            clip_start, clip_end = self._clips[p.clip]
            clip_end = min(clip_end, p.content_frames)
            p.seek = max(p.seek, clip_start)
            if p.seek >= clip_end:
                p.clip += 1
                if p.clip < len(self._clips):
                    p.seek = self._clips[p.clip][0]
                continue
            size = min(N_FRAMES, p.content_frames - p.seek, clip_end - p.seek)
            heard = self._voice_heard(p.seek, size) if self.ends_in_a_tail() else None
            if p.window_end is not None and p.window_end > p.seek:
                size = min(size, p.window_end - p.seek)
            p.window_end = None
            window = first if first is not None and p.seek == 0 and size == first.size else None
            window = window or Window(p.seek, size, *read_window(self._step.model, self.stream, p.seek, size,
                                                                 self._file_peak, encode, heard))
            if self.stream.exhausted:
                p.content_frames = int(self.stream.n_samples // HOP_LENGTH)
            return window
        return None

    def _voice_heard(self, seek: int, size: int) -> Callable[[np.ndarray], bool] | None:
        """Where words are checked against voice, whether the VAD hears voice in the samples of the stream's last
        window (at ``seek``, ``size`` frames): a tail without voice is passed over as silence, not encoded and
        decoded (openai's loop decodes the fraction of a second after a last word, even two frames of it, and
        what it writes there the guard drops as words without voice; a prompt that leads the decoding astray
        made every temperature of it fail)."""
        guard = self._step.guard
        if guard is None or not guard.check_words:
            return None

        def heard(samples: np.ndarray) -> bool:
            last = self.stream.exhausted and seek + size >= self.stream.n_samples // HOP_LENGTH
            return not last or guard.hears_voice(Window(seek, size, None, samples))

        return heard

    def _refine_length(self) -> None:
        """The stream refines its length as it reads (mp3 headers can be approximate): exact once it is read."""
        frames = int(self.stream.n_samples // HOP_LENGTH)
        p = self.position
        p.content_frames = frames if self.stream.exhausted else max(p.content_frames, frames)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.language.of(None)[0]
