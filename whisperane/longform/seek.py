"""openai-whisper's seek loop over one audio stream (``SeekLoop``): next window -> decode (with temperature
fallback) -> segments -> words -> the seek guard -> advance. Audio is read through a bounded stream, so memory
does not grow with its length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..audio import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    INPUT_STRIDE,
    N_FRAMES,
    SAMPLE_RATE,
    TIME_PRECISION,
    AudioStream,
)
from ..decoding import DecodingResult, decode, detect_language
from ..errors import WhisperaneError
from ..options import TranscribeOptions
from ..result import Segment, TranscriptionResult, result_from_segments, segment_from_dict
from ..runtime.decoder_adapters import CrossAttention
from ..runtime.model import WhisperaneModel
from ..tokenizer import Tokenizer
from .guard import GUARD_MIN_SPEECH_FRAMES, GUARD_TAIL_MIN_FRAMES, VoiceCheck, VoiceRegions, resume_point
from .hallucinations import get_end, skip_hallucinations
from .voiced import check_segments, edges_onto_voice, voice_in_silence
from .window import Window, clip_ranges, read_window
from .words import add_words, instants_onto_voice, trim_words_to_sound

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
    """openai-whisper's seek loop over one audio stream: next window -> decode -> words -> advance. The state
    of the loop (seek, the previous text for the prompt, the segments so far) belongs to this call."""

    def __init__(self, model: WhisperaneModel, stream: AudioStream, options: TranscribeOptions,
                 progress: Callable[[float, float], None] | None, voice: VoiceCheck | None = None,
                 file_peak: float | None = None, on_segment: Callable[[Segment], None] | None = None,
                 voiced_words: bool = False):
        if stream.n_samples == 0:
            raise WhisperaneError(f"{stream.name}: the audio holds no samples")
        self.model, self.stream, self.options, self.progress = model, stream, options, progress
        # Total length: exact for arrays and wav/flac; from the header for mp3 (refined as the stream is read).
        self.content_frames = int(stream.n_samples // HOP_LENGTH)
        self.clips = clip_ranges(options.clip_timestamps, self.content_frames)
        self.clip_index = 0
        self.seek = self.clips[0][0]
        self.all_tokens: list[int] = []
        self.all_segments: list[dict] = []
        self.prompt_reset_since = 0
        self.last_speech_timestamp = 0.0
        self.window_index = 0
        self.language_probs: dict[str, float] | None = None
        self.first_window: Window | None = None  # encoded for language detection, reused by the loop
        self.voice = voice  # what the seek guard asks whether a stretch holds voice (None: no guard)
        self.resumed: set[int] = set()  # windows the guard started: never guarded again
        self.window_end: int | None = None  # where the guard ends the next window (the unheard stretch alone)
        self.file_peak = file_peak  # the whole file's log-mel peak (openai's floor), None: each window's own
        self.on_segment = on_segment  # called with each kept segment (transcribe's hook for streamed results)
        # words only where the voice check hears voice (longform.voiced): the default mode; batched mode and
        # vad_filter decode the VAD's speech alone already
        self.voiced_words = voiced_words and voice is not None
        # voice after the window's last word that sends the guard back (less in the default mode: longform.voiced)
        self.tail_min_frames = GUARD_TAIL_MIN_FRAMES if self.voiced_words else GUARD_MIN_SPEECH_FRAMES

    @classmethod
    def over_speech(cls, model: WhisperaneModel, stream: SpeechStream, options: TranscribeOptions,
                    progress: Callable[[float, float], None] | None, voiced: Sequence | None = None,
                    on_segment: Callable[[Segment], None] | None = None) -> SeekLoop:
        """The loop over a VAD's speech alone (vad_filter, a lane of batched mode), the seek guard asking the
        voiced regions of the same VAD pass (``voiced``: VoiceRegions.of_speech)."""
        guard = VoiceRegions.of_speech(stream, voiced) if options.speech_guard else None
        return cls(model, stream, options, progress, guard, on_segment=on_segment)

    def run(self) -> TranscriptionResult:
        self.run_windows()
        duration = self.stream.n_samples / SAMPLE_RATE
        return result_from_segments(self.all_segments, self.tokenizer, duration, self.language_probs, self.options.word_timestamps)

    def run_windows(self) -> None:
        self.begin(self._tokenizer_for_language(), self.language_probs)
        while (window := self._next_window()) is not None:
            self.finish_window(window)

    def begin(self, tokenizer: Tokenizer, language_probs: dict[str, float] | None,
              previous_text: Sequence[int] | None = None) -> None:
        """Start decoding with this language; the first window's prompt is ``previous_text`` (the text before
        this loop's audio, decoded by another loop) or else the initial prompt."""
        self.tokenizer, self.language_probs = tokenizer, language_probs
        if previous_text is not None:
            self.all_tokens = list(previous_text)
        elif self.options.initial_prompt:
            self.all_tokens.extend(self.tokenizer.encode(" " + self.options.initial_prompt.strip()))

    @property
    def prompt(self) -> list[int]:
        return self.all_tokens[self.prompt_reset_since :]

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
            self._decode_window(window, first)
        if self.progress:
            done = min(self.seek, self.content_frames) / FRAMES_PER_SECOND
            self.progress(done, self.content_frames / FRAMES_PER_SECOND)

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

    def _decode_window(self, w: Window, first: DecodingResult | None = None) -> None:
        options = self.options
        result = decode_with_fallback(self.model, w.enc, options, self.prompt, self.tokenizer, self.language_probs,
                                       self.window_index, [first] if first else [])
        self.window_index += 1
        if is_silence(result, options):
            resume = voice_in_silence(self.voice, w) if self.voiced_words and w.seek not in self.resumed else None
            if resume is not None:  # decoded again without the prompt: the voice and a second after it alone
                self.resumed.add(resume.frame)
                self.window_end, self.seek = resume.unheard_end, resume.frame
                self.prompt_reset_since = len(self.all_tokens)
                return
            self.seek = w.seek + w.size
            return
        segments, seek, single_timestamp_ending = split_segments(result, self.tokenizer, w.seek, w.size)
        if options.word_timestamps:
            add_words(self.model, w.enc, result, segments, self.tokenizer, options, w.time_offset, w.size,
                       self.last_speech_timestamp)
            if self.voice is not None:
                instants_onto_voice(w, segments, self.voice)
            if not single_timestamp_ending:  # openai's rule: the next window starts where DTW put the last word
                last_word_end = get_end(segments)
                if last_word_end is not None and last_word_end > w.time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)
                    # A segment after the last word lost all its words to the alignment: its audio is decoded
                    # again from the seek, and kept it would come twice, out of order.
                    segments = [s for s in segments if s.get("words") or s["start"] < last_word_end]
            if options.hallucination_silence_threshold is not None:
                seek, segments, skipped = skip_hallucinations(options.hallucination_silence_threshold,
                                                              self.last_speech_timestamp, self.content_frames,
                                                              w, segments, seek)
                if skipped:
                    self.seek = seek
                    return
        voiced = None
        if self.voiced_words and options.word_timestamps:
            segments, voiced = check_segments(self.voice, w, segments, w.seek not in self.resumed)
        resume = resume_point(self.voice, self.resumed, w, segments, seek, self.tail_min_frames)
        # the earlier of the two: voice the guard finds before the segment the voice check decodes again comes first
        alone = voiced is not None and (resume is None or voiced.frame <= resume.frame)
        resume = voiced if alone else resume
        if resume is None:
            self._commit(w, result, segments, seek)
            return
        # Decoded again from there, without the prompt that may have led it astray. Where there was no prompt to
        # drop (a lane's or the file's first window), that would be much the same decoding (from the window's start,
        # or from a lead-in before the voice: it jumped over the same voice again), so the unheard stretch is
        # decoded alone, and the decoding cannot jump over it again.
        if alone or not self.prompt:
            self.window_end = resume.unheard_end
        segments = [s for s in segments if s["end"] * FRAMES_PER_SECOND <= resume.frame + 1]
        self.resumed.add(resume.frame)
        self._commit(w, result, segments, resume.frame, resumed=True)

    def _commit(self, w: Window, result: DecodingResult, segments: list[dict], seek: int, resumed: bool = False) -> None:
        """Keep the window's segments (never ending past the window's audio, never empty) and move ``seek`` on: past the
        window's start, unless the seek guard ``resumed`` there (it decodes a window again once, without the
        prompt, and never guards that window again)."""
        # the window's audio: to the end of the stream for its last window (whose partial last frame it holds),
        # else to its last frame
        end = self.stream.n_samples if w.seek + w.size >= self.content_frames else (w.seek + w.size) * HOP_LENGTH
        end /= SAMPLE_RATE
        last_word_end = get_end(segments) if self.options.word_timestamps else None
        if last_word_end is not None:  # of the kept segments: a resumed window is aligned again after them
            self.last_speech_timestamp = last_word_end
            trim_words_to_sound(segments, w.samples, w.time_offset)  # refines the reported word times only
            if self.voiced_words:
                edges_onto_voice(self.voice, w, segments)
        for s in segments:
            s["end"] = min(s["end"], end)
            s["start"] = min(s["start"], s["end"])
        for s in segments:
            if s["start"] != s["end"] and s["text"].strip():
                s["id"] = len(self.all_segments)
                self.all_segments.append(s)
                self.all_tokens.extend(s["tokens"])
                if self.on_segment:
                    self.on_segment(segment_from_dict(s, self.options.word_timestamps))
        if not self.options.condition_on_previous_text or result.temperature > 0.5 or resumed:
            self.prompt_reset_since = len(self.all_tokens)  # no prompt after a high temperature
        self.seek = seek if seek > w.seek or resumed else w.seek + max(w.size, 1)  # never stall



def decode_with_fallback(model, enc, options: TranscribeOptions, prompt, tokenizer, language_probs, seed,
                          tried: Sequence[DecodingResult] = ()) -> DecodingResult:
    """Decode at each temperature in turn until a result passes the compression-ratio and log-probability
    checks (``tried``: results at the first temperatures, already decoded). When none does, the result with the
    best average log-probability among those not too repetitive (else among all) is kept, as faster-whisper
    does: openai-whisper keeps the last, highest-temperature one, which on a fragile window (a fraction of a
    second of tail audio) is the most likely to be noise."""
    tried = list(tried)
    if tried and not _needs_fallback(tried[-1], options):
        return tried[-1]
    for t in options.temperature[len(tried) :]:
        result = decode(model, enc, options.decoding(t, tokenizer.language, prompt, seed), tokenizer, language_probs)
        tried.append(result)
        if not _needs_fallback(result, options):
            return result
    threshold = options.compression_ratio_threshold
    not_repetitive = [r for r in tried if threshold is None or r.compression_ratio <= threshold]
    return max(not_repetitive or tried, key=lambda r: r.avg_logprob)


def _needs_fallback(result: DecodingResult, options: TranscribeOptions) -> bool:
    """Too repetitive or too unlikely, unless silence (no-speech probability high and the text unlikely: a
    confident result, a loop at a tail of audio say, still falls back: openai-whisper's rule since late 2024,
    and faster-whisper's)."""
    if options.no_speech_threshold is not None and result.no_speech_prob > options.no_speech_threshold:
        if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
            return False
    if options.compression_ratio_threshold is not None and result.compression_ratio > options.compression_ratio_threshold:
        return True
    return options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold


def is_silence(result: DecodingResult, options: TranscribeOptions) -> bool:
    """openai's no-speech rule: <|nospeech|> likely and the text not confident."""
    if options.no_speech_threshold is None or result.no_speech_prob <= options.no_speech_threshold:
        return False
    return options.logprob_threshold is None or result.avg_logprob <= options.logprob_threshold


def split_segments(result: DecodingResult, tokenizer: Tokenizer, seek: int, segment_size: int) -> tuple[list[dict], int, bool]:
    """openai-whisper's split of a window's tokens into segments at consecutive timestamp pairs.

    Returns the segments, the next seek (from the last complete timestamp pair, or the whole window) and
    whether the tokens end with a single timestamp (no speech after it).
    """
    tokens = list(result.tokens)
    time_offset = seek * HOP_LENGTH / SAMPLE_RATE
    tb = tokenizer.timestamp_begin

    def new_segment(start: float, end: float, toks: list[int]) -> dict:
        text_tokens = [t for t in toks if t < tokenizer.eot]
        return {
            "seek": seek, "start": start, "end": end, "text": tokenizer.decode(text_tokens), "tokens": toks,
            "temperature": result.temperature, "avg_logprob": result.avg_logprob,
            "compression_ratio": result.compression_ratio, "no_speech_prob": result.no_speech_prob,
        }

    is_ts = [t >= tb for t in tokens]
    single_timestamp_ending = is_ts[-2:] == [False, True]
    consecutive = [i + 1 for i in range(len(is_ts) - 1) if is_ts[i] and is_ts[i + 1]]
    segments: list[dict] = []
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
        last_slice = 0
        for current_slice in slices:
            sliced = tokens[last_slice:current_slice]
            start, end = (sliced[0] - tb) * TIME_PRECISION, (sliced[-1] - tb) * TIME_PRECISION
            segments.append(new_segment(time_offset + start, time_offset + end, sliced))
            last_slice = current_slice
        if single_timestamp_ending:
            next_seek = seek + segment_size  # no speech after the last timestamp
        else:
            # never past the window's audio: a decoding may write timestamps beyond it (a short last window, a
            # clip of clip_timestamps), and audio the window did not hold was not transcribed
            next_seek = seek + min((tokens[last_slice - 1] - tb) * INPUT_STRIDE, segment_size)
    else:
        duration = segment_size * HOP_LENGTH / SAMPLE_RATE
        timestamps = [t for t in tokens if t >= tb]
        if timestamps and timestamps[-1] != tb:
            duration = (timestamps[-1] - tb) * TIME_PRECISION  # a single timestamp at the end
        segments.append(new_segment(time_offset, time_offset + duration, tokens))
        next_seek = seek + segment_size
    return segments, next_seek, single_timestamp_ending
