"""openai-whisper's seek loop over one audio stream (``SeekLoop``): the position in the stream, the prompt and the
segments so far; each window is one ``step.WindowStep`` (decode, words, the speech guard), whose outcome moves the
loop on. Audio is read through a bounded stream, so memory does not grow with its length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, AudioStream
from ..decoding import DecodingResult, detect_language
from ..errors import WhisperaneError
from ..options import TranscribeOptions
from ..prompts import window_prompt
from ..result import Segment, TranscriptionResult, result_from_segments, rounded
from ..runtime.decoder_adapters import CrossAttention
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


def choose_language(model: WhisperaneModel, enc: CrossAttention | None,
                    options: TranscribeOptions) -> tuple[Tokenizer, dict[str, float] | None]:
    """The tokenizer of the given language, or of the one detected on ``enc`` (a multilingual model without a
    language; English when there is nothing to detect from: the transcript will be empty), and the detected
    language's probabilities."""
    language, probs = options.language, None
    if model.is_multilingual and language is None:
        if enc is not None:
            language, probs = detect_language(model, enc, model.tokenizer())
        else:
            language = "en"
    return model.tokenizer(language=language, task=options.task), probs


class SeekLoop:
    """openai-whisper's seek loop over one audio stream: next window -> ``WindowStep`` -> advance. What it keeps
    belongs to this call: the position (``seek``, the clip of clip_timestamps, where the guard ends the next
    window), the prompt (the text so far and where it was last reset) and the segments so far."""

    def __init__(self, model: WhisperaneModel, stream: AudioStream, options: TranscribeOptions,
                 progress: Callable[[float, float], None] | None = None, guard: SpeechGuard | None = None,
                 file_peak: float | None = None, on_segment: Callable[[Segment], None] | None = None):
        if stream.n_samples == 0:
            raise WhisperaneError(f"{stream.name}: the audio holds no samples")
        self.model, self.stream, self.options, self.progress = model, stream, options, progress
        self.guard = guard  # None: no speech guard
        self.file_peak = file_peak  # the whole file's log-mel peak (openai's floor), None: each window's own
        self.on_segment = on_segment  # called with each kept segment (transcribe's hook for streamed results)
        # Total length: exact for arrays and wav/flac; from the header for mp3 (refined as the stream is read).
        self.content_frames = int(stream.n_samples // HOP_LENGTH)
        self.clips = clip_ranges(options.clip_timestamps, self.content_frames)
        self.clip_index = 0
        self.seek = self.clips[0][0]
        self.window_end: int | None = None  # where the guard ends the next window (the unheard stretch alone)
        self.window_index = 0
        self.resumed: set[int] = set()  # windows the guard started: never guarded again
        self.all_tokens: list[int] = []
        self.initial_tokens: list[int] = []  # the initial prompt's (carried into every window's prompt if asked)
        self.prompt_reset_since = 0
        self.segments: list[Segment] = []
        self.last_speech = 0.0  # the end of the last kept word
        self.first_window: Window | None = None  # encoded for language detection, reused by the loop
        self.step: WindowStep | None = None
        self.tokenizer: Tokenizer | None = None
        self.language_probs: dict[str, float] | None = None

    @classmethod
    def over_speech(cls, model: WhisperaneModel, stream: SpeechStream, options: TranscribeOptions,
                    progress: Callable[[float, float], None] | None, voiced: Sequence | None = None,
                    on_segment: Callable[[Segment], None] | None = None) -> SeekLoop:
        """The loop over a VAD's speech alone (vad_filter, a lane of batched mode), the speech guard asking the
        voiced regions of the same VAD pass (``voiced``: VoiceRegions.of_speech)."""
        guard = SpeechGuard.over_speech(stream, voiced) if options.speech_guard else None
        return cls(model, stream, options, progress, guard, on_segment=on_segment)

    def run(self) -> TranscriptionResult:
        self.run_windows()
        duration = self.stream.n_samples / SAMPLE_RATE
        return result_from_segments(self.segments, self.tokenizer, duration, self.language_probs,
                                    self.options.word_timestamps)

    def run_windows(self) -> None:
        self.begin(self._tokenizer_for_language(), self.language_probs)
        while (window := self._next_window()) is not None:
            self.finish_window(window)

    def begin(self, tokenizer: Tokenizer, language_probs: dict[str, float] | None,
              previous_text: Sequence[int] | None = None) -> None:
        """Start decoding with this language; the first window's prompt is ``previous_text`` (the text before
        this loop's audio, decoded by another loop) or else the initial prompt."""
        self.tokenizer, self.language_probs = tokenizer, language_probs
        self.step = WindowStep(self.model, self.options, tokenizer, language_probs, self.guard)
        if self.options.initial_prompt:
            self.initial_tokens = tokenizer.encode(" " + self.options.initial_prompt.strip())
        # previous_text is another loop's prompt: with carry_initial_prompt, it starts with the initial prompt
        self.all_tokens = list(previous_text) if previous_text is not None else [*self.initial_tokens]

    @property
    def prompt(self) -> list[int]:
        return window_prompt(self.all_tokens, self.prompt_reset_since, self.initial_tokens,
                             self.options.carry_initial_prompt, self.model.dims.n_text_ctx)

    def next_window(self) -> Window | None:
        """The next window with its log-mel, not encoded (for windows of several loops encoded and decoded
        together, then given back one by one to ``finish_window``); digital silence is passed over."""
        while (window := self._next_window(encode=False)) is not None and window.is_silence:
            self.finish_window(window)
        return window

    def finish_window(self, window: Window, first: DecodingResult | None = None) -> None:
        """Decode ``window`` (``first``: its result at the first temperature, decoded with other windows) and
        move on."""
        if window.is_silence:
            self.seek = window.seek + window.size
        else:
            self._advance(self._step(window, first))
        if self.progress:
            done = min(self.seek, self.content_frames) / FRAMES_PER_SECOND
            self.progress(done, self.content_frames / FRAMES_PER_SECOND)

    def ends_in_a_tail(self) -> bool:
        """Whether the next window would be the stream's last and not full, after at least one window of this loop
        (one the speech guard bounds is not: ``window_end``)."""
        left = self.content_frames - self.seek
        return self.window_index > 0 and self.window_end is None and 0 < left < N_FRAMES

    def _step(self, w: Window, first: DecodingResult | None) -> WindowOutcome:
        outcome = self.step(w, self.prompt, self.window_index, may_resume=w.seek not in self.resumed,
                            last_speech=self.last_speech, content_frames=self.content_frames,
                            audio_end=w.audio_end(self.content_frames, self.stream.n_samples), first=first)
        self.window_index += 1
        return outcome

    def _advance(self, outcome: WindowOutcome) -> None:
        for segment in outcome.segments:
            segment = replace(segment, id=len(self.segments))
            self.segments.append(segment)
            self.all_tokens.extend(segment.tokens)
            if self.on_segment:
                self.on_segment(rounded(segment, segment.id))
        if outcome.last_speech is not None:
            self.last_speech = outcome.last_speech
        if outcome.reset_prompt:  # no prompt after a high temperature, or where the guard decodes again
            self.prompt_reset_since = len(self.all_tokens)
        if outcome.resumed:
            self.resumed.add(outcome.seek)
        self.window_end, self.seek = outcome.window_end, outcome.seek

    def _tokenizer_for_language(self) -> Tokenizer:
        enc = None
        if self.model.is_multilingual and self.options.language is None:
            # The same frames the first window of the loop reads, so that the loop reuses this encoding.
            size = min(N_FRAMES, self.content_frames)
            self.first_window = Window(0, size, *read_window(self.model, self.stream, 0, size, self.file_peak))
            enc = self.first_window.enc
        tokenizer, self.language_probs = choose_language(self.model, enc, self.options)
        return tokenizer

    def _next_window(self, encode: bool = True) -> Window | None:
        """The window at ``seek`` (moving on to the next clip of clip_timestamps where one ends), or None."""
        while self.clip_index < len(self.clips):
            if self.stream.exhausted:  # the stream refines its length as it reads (mp3 headers can be approximate)
                self.content_frames = int(self.stream.n_samples // HOP_LENGTH)
            else:
                self.content_frames = max(self.content_frames, int(self.stream.n_samples // HOP_LENGTH))
            clip_start, clip_end = self.clips[self.clip_index]
            clip_end = min(clip_end, self.content_frames)
            self.seek = max(self.seek, clip_start)
            if self.seek >= clip_end:
                self.clip_index += 1
                if self.clip_index < len(self.clips):
                    self.seek = self.clips[self.clip_index][0]
                continue
            size = min(N_FRAMES, self.content_frames - self.seek, clip_end - self.seek)
            if self.window_end is not None and self.window_end > self.seek:
                size = min(size, self.window_end - self.seek)
            self.window_end = None
            first, self.first_window = self.first_window, None
            window = first if first is not None and self.seek == 0 and size == first.size else None
            window = window or Window(self.seek, size, *read_window(self.model, self.stream, self.seek, size, self.file_peak, encode))
            if self.stream.exhausted:
                self.content_frames = int(self.stream.n_samples // HOP_LENGTH)
            return window
        return None
