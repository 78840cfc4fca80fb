"""Long-form transcription: openai-whisper's seek loop over 30 s windows, with word timestamps.

Audio is read through a bounded stream (``audio.open_audio``), so memory does not grow with its length.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import timing
from .audio import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    INPUT_STRIDE,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    TIME_PRECISION,
    AudioStream,
    open_audio,
)
from .decoding import DecodingResult, decode, detect_language
from .errors import OptionsError, WhisperaneError
from .model import EncodedWindow, WhisperaneModel
from .options import TranscribeOptions
from .tokenizer import Tokenizer

if TYPE_CHECKING:  # the VAD module is imported where it is used (vad_filter, batched mode)
    from .vad import SpeechStream


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True)
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens"] = list(self.tokens)
        d["words"] = None if self.words is None else [asdict(w) for w in self.words]
        if self.words is None:
            d.pop("words")
        return d


@dataclass(frozen=True)
class TranscriptionResult:
    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...]
    language_probs: dict[str, float] | None = None

    def to_dict(self) -> dict:
        d = {"text": self.text, "language": self.language, "duration": self.duration,
             "segments": [s.to_dict() for s in self.segments]}  # fmt: skip
        if self.language_probs is not None:
            d["language_probs"] = dict(sorted(self.language_probs.items(), key=lambda kv: -kv[1])[:5])
        return d


def transcribe(
    audio: str | os.PathLike | np.ndarray | AudioStream,
    model: str | os.PathLike | WhisperaneModel = "tiny.en",
    language: str | None = None,
    task: str = "transcribe",
    word_timestamps: bool = True,
    progress: Callable[[float, float], None] | None = None,
    **kwargs,
) -> TranscriptionResult:
    """Transcribe a file path, a 16 kHz mono float array or an open AudioStream.

    ``kwargs`` are the fields of :class:`TranscribeOptions` (an unknown name is a TypeError; an invalid value
    an OptionsError). A model name or path is loaded once and reused by later calls. ``progress(seconds_done,
    duration)`` is called after each window.
    """
    unknown = set(kwargs) - {f.name for f in fields(TranscribeOptions)}
    if unknown:
        raise TypeError(f"unknown transcribe option(s): {', '.join(sorted(unknown))}")
    options = TranscribeOptions(language=language, task=task, word_timestamps=word_timestamps, **kwargs)
    if not isinstance(model, WhisperaneModel):
        from .loading import shared_model

        model = shared_model(model)
    _check_model_supports(model, options)
    if options.batch_size is not None:
        from .chunked import transcribe_chunked

        if isinstance(audio, AudioStream):
            raise OptionsError("batched mode reads the audio twice (VAD, then chunks): pass a path or an array")
        return transcribe_chunked(model, lambda: open_audio(audio), options, progress)
    if options.vad_filter:
        return _transcribe_speech(model, audio, options, progress)
    voice = VoiceOnDemand() if options.speech_guard else None
    peak = None
    if not isinstance(audio, AudioStream):  # a stream can be read once: its windows keep their own peaks
        with open_audio(audio) as first_pass:  # one window (<= 30 s): its own peak is the file's
            peak = model.mel_peak(first_pass) if first_pass.n_samples > N_SAMPLES else None
    stream = audio if isinstance(audio, AudioStream) else open_audio(audio)
    try:
        return Transcription(model, stream, options, progress, voice, peak).run()
    finally:
        if stream is not audio:
            stream.close()


def _heard_frames(segments: list[dict], window_seek: int) -> list[tuple[int, int]]:
    """The frames (from the window's start) that words cover; a segment's own span without word timestamps."""
    spans = []
    for s in segments:
        if s["text"].strip():
            for x in s["words"] if s.get("words") else [s]:
                start, end = (round(x[k] * FRAMES_PER_SECOND) - window_seek for k in ("start", "end"))
                spans.append((start, end))
    return spans


class Voice(NamedTuple):
    """What Silero VAD hears in a stretch of a window: its voiced mel frames, and the first of them (from the
    window's start; the stretch's end when there is none)."""

    frames: int
    onset: int


class VoiceCheck:
    """Where Silero VAD hears voice (vad.VOICED) in a stretch of a window, for the seek guard."""

    def runs(self, w: Window, start: int, end: int) -> list[tuple[int, int]]:
        """The voiced runs ``[a, b)`` in ``[start, end)`` of window ``w``, in order (frames from its start). The
        stretch comes from decoded times, which may point anywhere (before the window, past the audio it
        holds): it is clipped to the window's audio, and an empty stretch has no voice."""
        start, end = max(0, start), min(end, w.held_frames)
        return self.voiced_runs(w, start, end) if end > start else []

    def voiced_runs(self, w: Window, start: int, end: int) -> list[tuple[int, int]]:
        """``runs`` of a stretch inside the window's audio (``0 <= start < end <= w.held_frames``)."""
        raise NotImplementedError

    def voice(self, w: Window, start: int, end: int) -> Voice:
        """The voice in ``[start, end)`` of window ``w``."""
        runs = self.runs(w, start, end)
        return Voice(sum(b - a for a, b in runs), runs[0][0] if runs else end)


class VoiceOnDemand(VoiceCheck):
    """The VAD run on the stretch itself, only when the guard asks (a stretch of GUARD_MIN_SPEECH_FRAMES or more
    without words, or a segment at one instant: ``_instants_onto_voice``): most windows of speech have none
    (602 s tiny.en file: 14 stretches, 0.2 of 120 CPU s; 609 s file: two instants, 6 ms).

    Without the VAD model (not cached, and PyPI out of reach) the guard is off, with one warning."""

    def __init__(self):
        self.unavailable = False

    def voiced_runs(self, w, start, end):
        from .vad import VOICED, default_vad, speech_regions

        if self.unavailable:
            return []
        try:
            vad = default_vad()
        except WhisperaneError as e:
            self.unavailable = True
            warnings.warn(f"speech guard off: {e}", stacklevel=2)
            return []
        probabilities, n_samples = vad.speech_probabilities(w.samples[start * HOP_LENGTH : end * HOP_LENGTH])
        regions = speech_regions(probabilities, n_samples, VOICED)
        # each region's frames rounded up, as the guard has always counted them
        return [(start + r.start // HOP_LENGTH, start + r.start // HOP_LENGTH + -(-r.n_samples // HOP_LENGTH)) for r in regions]


class VoiceRegions(VoiceCheck):
    """Voiced regions known beforehand (vad_filter's VAD pass), in mel frames of the stream."""

    def __init__(self, frames: list[tuple[int, int]]):
        self.frames = frames

    def voiced_runs(self, w, start, end):
        overlaps = [(max(w.seek + start, a) - w.seek, min(w.seek + end, b) - w.seek) for a, b in self.frames]
        return [(a, b) for a, b in overlaps if b > a]

    @classmethod
    def of_speech(cls, stream, voiced: Sequence | None = None) -> VoiceRegions:
        """A SpeechStream's voiced regions on its speech-only timeline (those in removed audio map to nothing);
        ``voiced``: the whole audio's vad.VOICED regions when known (several streams over one VAD pass)."""
        from .vad import VOICED, speech_regions

        frames = []
        for r in voiced if voiced is not None else speech_regions(stream.probabilities, stream.original_n_samples, VOICED):
            start, end = (stream.time_map.speech_time(t / SAMPLE_RATE) * FRAMES_PER_SECOND for t in (r.start, r.end))
            if end > start:
                frames.append((int(start), math.ceil(end)))
        return cls(frames)


def _transcribe_speech(model: WhisperaneModel, audio, options: TranscribeOptions, progress) -> TranscriptionResult:
    """vad_filter: the seek loop over the speech alone (with the seek guard), its times put back on the
    original audio."""
    from .chunked import vad_options
    from .vad import restore_timestamps, speech_stream

    vad = vad_options(options, batched=False)
    with speech_stream(audio, vad) as stream:
        duration = stream.original_duration
        if stream.n_samples == 0:
            return _empty_result(model, options, duration)
        loop = Transcription.over_speech(model, stream, options, progress)
        loop.run_windows()
        restore_timestamps(loop.all_segments, stream.time_map, stream.probabilities >= vad.threshold)
        return _result(loop.all_segments, loop.tokenizer, duration, loop.language_probs, options.word_timestamps)


def _check_model_supports(model: WhisperaneModel, options: TranscribeOptions) -> None:
    if not model.is_multilingual and options.task == "translate":
        raise OptionsError("English-only models cannot translate; use a multilingual model")
    if not model.is_multilingual and options.language not in (None, "en"):
        raise OptionsError(f"English-only models transcribe English only, not {options.language!r}")

# 1.5 s of voiced frames (vad.VOICED) between two words, or before the first or after the last: speech the
# decoding skipped. Between the words of a good transcript there are at most 0.74 s (tiny.en, 602 s file: DTW
# word edges and pauses the VAD still calls voice); the skips seen there held 9.5 s and 13.4 s.
GUARD_MIN_SPEECH_FRAMES = 150
# A resumed decoding starts this far ahead of the voice it found without words (when that is later than the last
# kept segment's end): the stretch before holds no word and no voice, and a window that began with 8 s of digital
# silence before the voice made tiny.en write a sentence three times into the silence. The lead-in covers the
# VAD's late onsets (0.22 s after a clip's first fricative on the corpus).
GUARD_LEAD_IN_FRAMES = 100


# Voice that no word covers, enough to hold a segment that DTW put at one instant (the sonnet's "1." had 0.39 s).
INSTANT_MIN_VOICE_FRAMES = 20


def _instants_onto_voice(w: Window, segments: list[dict], voice: VoiceCheck) -> None:
    """A decoded segment whose words DTW put at one instant (start == end) is cleared by openai's loop; where
    the VAD hears a run of INSTANT_MIN_VOICE_FRAMES or more of voice between the words before and after it (not
    the voice running on from their edges), its words share the run nearest to the instant (by their characters)
    and the text is kept (tiny.en, the sonnet after a VAD cut: "1." decoded between "surpassed." and "From", put
    0.43 s after its 0.39 s of voice, in the pause). One run: an instant that ends a window must not reach over
    the voice after it, which the next window decodes."""
    words = [x for s in segments for x in s.get("words") or []]
    position = {id(x): i for i, x in enumerate(words)}
    for s in segments:
        own = s.get("words") or []
        if not own or s["start"] != s["end"] or not s["text"].strip():
            continue
        first, after = position[id(own[0])], position[id(own[-1])] + 1
        low = words[first - 1]["end"] if first else w.time_offset
        high = words[after]["start"] if after < len(words) else w.end_time
        start, end = (round((t - w.time_offset) * FRAMES_PER_SECOND) for t in (low, high))
        runs = voice.runs(w, start, end) if end - start >= INSTANT_MIN_VOICE_FRAMES else []
        runs = [(a, b) for a, b in runs if (a > start or not first) and (b < end or after == len(words))]
        instant = (s["start"] - w.time_offset) * FRAMES_PER_SECOND
        a, b = min(runs, key=lambda r: max(r[0] - instant, instant - r[1], 0), default=(0, 0))
        if b - a < INSTANT_MIN_VOICE_FRAMES:
            continue
        lengths = np.cumsum([0, *(max(1, len(x["word"].strip())) for x in own)])
        edges = w.time_offset + (a + (b - a) * lengths / lengths[-1]) / FRAMES_PER_SECOND
        for x, word_start, word_end in zip(own, edges[:-1], edges[1:], strict=True):
            x["start"], x["end"] = round(float(word_start), 2), round(float(word_end), 2)
        s["start"], s["end"] = own[0]["start"], own[-1]["end"]


class Resume(NamedTuple):
    """Where the seek guard decodes again (``frame``), and where the voice it found without words ends
    (``unheard_end``: the next word's start, or the seek): both in mel frames of the stream."""

    frame: int
    unheard_end: int


def _resume_before(w: Window, segments: list[dict], gap_start: int, gap_end: int, onset: int) -> Resume:
    """Where to decode again for voice without words in ``[gap_start, gap_end)`` (window frames) whose first
    voiced frame is ``onset``: after the last segment that ends before the gap (the window's start if none), or
    GUARD_LEAD_IN_FRAMES before the voice where that is later; never past the start of a segment that is
    dropped to be decoded again."""
    ends = [round(s["end"] * FRAMES_PER_SECOND) for s in segments]
    frame = max([w.seek, *(e for e in ends if e <= w.seek + gap_start)])
    dropped = [round(s["start"] * FRAMES_PER_SECOND) for s, e in zip(segments, ends, strict=True) if e > frame]
    return Resume(max(frame, min([w.seek + onset, *dropped]) - GUARD_LEAD_IN_FRAMES), w.seek + gap_end)


SILENCE_PEAK = 1e-4  # -80 dBFS: below any recorded speech; such a window holds nothing to transcribe


def _read_window(model: WhisperaneModel, stream: AudioStream, seek: int, n_frames: int, file_peak: float | None,
                 encode: bool = True) -> tuple[EncodedWindow | None, np.ndarray, np.ndarray | None]:  # fmt: skip
    """The window at ``seek``: its encoding (or, without ``encode``, its log-mel for a batch encoded together),
    its samples. Neither for digital silence, where Whisper is known to invent " you" (with a no-speech
    probability that the log-probability rule overrides)."""
    start = seek * HOP_LENGTH
    samples = stream.read(start, min(n_frames * HOP_LENGTH, N_SAMPLES))
    peak = float(np.abs(samples).max()) if len(samples) else 0.0
    if peak < SILENCE_PEAK:
        return None, samples, None
    mel = model.log_mel(samples, file_peak)
    return (model.encode(mel), samples, None) if encode else (None, samples, mel)


WORD_FRAME = 320  # 20 ms, the resolution of word timestamps
# A 20 ms frame this far below the window's loudest one is silence: pauses in speech, and room noise in a
# recording, stay well above it (JFK's pauses sit 30-36 dB down, LibriSpeech's background 40-45 dB), so
# only word edges that DTW put in near-digital silence (a gap between recordings, padding) move.
SILENT_BELOW_PEAK_DB = 50.0


def _trim_words_to_sound(segments: list[dict], samples: np.ndarray, time_offset: float) -> None:
    """Move word edges that DTW left in silence onto the nearest sounding frame inside the word.

    DTW's path starts at the window's first frame, so the first word of a window absorbs any leading silence
    (openai-whisper's clamps catch only some of these); a word start inside a pause is never right.
    """
    n = len(samples) // WORD_FRAME
    if n == 0:
        return
    rms = np.sqrt(np.mean(samples[: n * WORD_FRAME].reshape(n, WORD_FRAME).astype(np.float64) ** 2, axis=1))
    db = 20 * np.log10(rms + 1e-10)
    sounding = db > float(db.max()) - SILENT_BELOW_PEAK_DB
    if not sounding.any():
        return
    for segment in segments:
        for w in segment.get("words") or []:
            a = max(0, int(round((w["start"] - time_offset) * 50)))
            b = min(n, int(round((w["end"] - time_offset) * 50)))
            if b <= a or not sounding[a:b].any():
                continue
            if not sounding[a]:
                w["start"] = round(time_offset + (a + int(np.argmax(sounding[a:b]))) / 50, 2)
            if not sounding[b - 1]:
                w["end"] = round(time_offset + (b - int(np.argmax(sounding[a:b][::-1]))) / 50, 2)


def _clip_ranges(clip_timestamps: Sequence[float], content_frames: int) -> list[tuple[int, int]]:
    frames = [round(v * FRAMES_PER_SECOND) for v in clip_timestamps]
    if len(frames) % 2 == 1:
        frames.append(content_frames)
    return [(min(s, content_frames), min(e, content_frames)) for s, e in zip(frames[::2], frames[1::2], strict=True)]

def _decode_with_fallback(model, enc, options: TranscribeOptions, prompt, tokenizer, language_probs, seed,
                          tried: Sequence[DecodingResult] = ()) -> DecodingResult:  # fmt: skip
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


def _empty_result(model: WhisperaneModel, options: TranscribeOptions, duration: float) -> TranscriptionResult:
    """The transcript of audio without speech: empty, not an error."""
    return _result([], model.tokenizer(options.language or "en", options.task), duration, None, options.word_timestamps)


def _result(segments: list[dict], tokenizer: Tokenizer, duration: float, language_probs, with_words: bool) -> TranscriptionResult:
    """The result of a whole file from its segments (in audio order)."""
    for i, s in enumerate(segments):
        s["id"] = i
    text = tokenizer.decode([t for s in segments for t in s["tokens"] if t < tokenizer.eot])
    return TranscriptionResult(text=text, language=tokenizer.language, duration=round(duration, 3),
                               segments=tuple(_segment(s, with_words) for s in segments),
                               language_probs=language_probs)  # fmt: skip


@dataclass(frozen=True)
class Window:
    """One 30 s window of the seek loop: where it starts, how much audio it holds, and its encoding (None for
    digital silence)."""

    seek: int  # mel frame of the window's start
    size: int  # mel frames of audio in the window (less than N_FRAMES at the end or a clip's end)
    enc: EncodedWindow | None
    samples: np.ndarray
    mel: np.ndarray | None = None  # a window read to be encoded with others (Transcription.next_window)

    @property
    def held_frames(self) -> int:
        """Mel frames of audio the window holds (its last one partial)."""
        return -(-len(self.samples) // HOP_LENGTH)

    @property
    def is_silence(self) -> bool:
        return self.enc is None and self.mel is None

    @property
    def time_offset(self) -> float:
        return float(self.seek * HOP_LENGTH / SAMPLE_RATE)

    @property
    def end_time(self) -> float:
        return float((self.seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE)

    @property
    def duration(self) -> float:
        return self.size * HOP_LENGTH / SAMPLE_RATE


class Transcription:
    """openai-whisper's seek loop over one audio stream: next window -> decode -> words -> advance. The state
    of the loop (seek, the previous text for the prompt, the segments so far) belongs to this call."""

    def __init__(self, model: WhisperaneModel, stream: AudioStream, options: TranscribeOptions,
                 progress: Callable[[float, float], None] | None, voice: VoiceCheck | None = None,
                 file_peak: float | None = None):  # fmt: skip
        if stream.n_samples == 0:
            raise WhisperaneError(f"{stream.name}: the audio holds no samples")
        self.model, self.stream, self.options, self.progress = model, stream, options, progress
        # Total length: exact for arrays and wav/flac; from the header for mp3 (refined as the stream is read).
        self.content_frames = int(stream.n_samples // HOP_LENGTH)
        self.clips = _clip_ranges(options.clip_timestamps, self.content_frames)
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

    @classmethod
    def over_speech(cls, model: WhisperaneModel, stream: SpeechStream, options: TranscribeOptions,
                    progress: Callable[[float, float], None] | None, voiced: Sequence | None = None) -> Transcription:  # fmt: skip
        """The loop over a VAD's speech alone (vad_filter, a lane of batched mode), the seek guard asking the
        voiced regions of the same VAD pass (``voiced``: VoiceRegions.of_speech)."""
        guard = VoiceRegions.of_speech(stream, voiced) if options.speech_guard else None
        return cls(model, stream, options, progress, guard)

    def run(self) -> TranscriptionResult:
        self.run_windows()
        duration = self.stream.n_samples / SAMPLE_RATE
        return _result(self.all_segments, self.tokenizer, duration, self.language_probs, self.options.word_timestamps)

    def run_windows(self) -> None:
        self.begin(self._tokenizer_for_language(), self.language_probs)
        while (window := self._next_window()) is not None:
            self.finish_window(window)

    def begin(self, tokenizer: Tokenizer, language_probs: dict[str, float] | None) -> None:
        self.tokenizer, self.language_probs = tokenizer, language_probs
        if self.options.initial_prompt:
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
        model, options = self.model, self.options
        language = options.language
        if model.is_multilingual and language is None:
            # The same frames the first window of the loop reads, so that the loop reuses this encoding.
            size = min(N_FRAMES, self.content_frames)
            self.first_window = Window(0, size, *_read_window(model, self.stream, 0, size, self.file_peak))
            if self.first_window.enc is not None:
                language, self.language_probs = detect_language(model, self.first_window.enc, model.tokenizer())
            else:  # nothing to detect from: the transcript will be empty
                language = "en"
        return model.tokenizer(language=language, task=options.task)

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
            window = window or Window(self.seek, size, *_read_window(self.model, self.stream, self.seek, size, self.file_peak, encode))
            if self.stream.exhausted:
                self.content_frames = int(self.stream.n_samples // HOP_LENGTH)
            return window
        return None

    def _decode_window(self, w: Window, first: DecodingResult | None = None) -> None:
        options = self.options
        result = _decode_with_fallback(self.model, w.enc, options, self.prompt, self.tokenizer, self.language_probs,
                                       self.window_index, [first] if first else [])  # fmt: skip
        self.window_index += 1
        if _is_silence(result, options):
            self.seek = w.seek + w.size
            return
        segments, seek, single_timestamp_ending = _split_segments(result, self.tokenizer, w.seek, w.size)
        if options.word_timestamps:
            _add_words(self.model, w.enc, result, segments, self.tokenizer, options, w.time_offset, w.size,
                       self.last_speech_timestamp)  # fmt: skip
            if self.voice is not None:
                _instants_onto_voice(w, segments, self.voice)
            if not single_timestamp_ending:  # openai's rule: the next window starts where DTW put the last word
                last_word_end = timing.get_end(segments)
                if last_word_end is not None and last_word_end > w.time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)
                    # A segment after the last word lost all its words to the alignment: its audio is decoded
                    # again from the seek, and kept it would come twice, out of order.
                    segments = [s for s in segments if s.get("words") or s["start"] < last_word_end]
            if options.hallucination_silence_threshold is not None:
                seek, segments, skipped = self._skip_hallucinations(w, segments, seek)
                if skipped:
                    self.seek = seek
                    return
        resume = self._resume_point(w, segments, seek)
        if resume is None:
            self._commit(w, result, segments, seek)
            return
        # Decoded again from there, without the prompt that may have led it astray. Where there was no prompt to
        # drop (a lane's or the file's first window), that would be much the same decoding (from the window's start,
        # or from a lead-in before the voice: it jumped over the same voice again), so the unheard stretch is
        # decoded alone, and the decoding cannot jump over it again.
        if not self.prompt:
            self.window_end = resume.unheard_end
        segments = [s for s in segments if s["end"] * FRAMES_PER_SECOND <= resume.frame + 1]
        self.resumed.add(resume.frame)
        self._commit(w, result, segments, resume.frame, resumed=True)

    def _resume_point(self, w: Window, segments: list[dict], seek: int) -> Resume | None:
        """The seek guard: where to decode again (without the prompt) when GUARD_MIN_SPEECH_FRAMES of voiced
        audio between the window's start and the next seek produced no word (openai's rule would skip it: a
        decoding that stopped early on a timestamp, or jumped over speech): the end of the last segment before
        that gap, or the window's start. At most once per window: not for a window the guard started."""
        if self.voice is None or w.seek in self.resumed or seek <= w.seek:
            return None
        previous_end = 0
        for start, end in [*sorted(_heard_frames(segments, w.seek)), (seek - w.seek, seek - w.seek)]:
            gap_end = min(max(start, previous_end), seek - w.seek)
            if gap_end - previous_end >= GUARD_MIN_SPEECH_FRAMES:
                voice = self.voice.voice(w, previous_end, gap_end)
                if voice.frames >= GUARD_MIN_SPEECH_FRAMES:
                    return _resume_before(w, segments, previous_end, gap_end, voice.onset)
            previous_end = max(previous_end, end)
        return None

    def _commit(self, w: Window, result: DecodingResult, segments: list[dict], seek: int, resumed: bool = False) -> None:
        """Keep the window's segments (never ending past the window's audio, never empty) and move ``seek`` on: past the
        window's start, unless the seek guard ``resumed`` there (it decodes a window again once, without the
        prompt, and never guards that window again)."""
        # the window's audio: to the end of the stream for its last window (whose partial last frame it holds),
        # else to its last frame
        end = self.stream.n_samples if w.seek + w.size >= self.content_frames else (w.seek + w.size) * HOP_LENGTH
        end /= SAMPLE_RATE
        last_word_end = timing.get_end(segments) if self.options.word_timestamps else None
        if last_word_end is not None:  # of the kept segments: a resumed window is aligned again after them
            self.last_speech_timestamp = last_word_end
            _trim_words_to_sound(segments, w.samples, w.time_offset)  # refines the reported word times only
        for s in segments:
            s["end"] = min(s["end"], end)
            s["start"] = min(s["start"], s["end"])
        for s in segments:
            if s["start"] != s["end"] and s["text"].strip():
                s["id"] = len(self.all_segments)
                self.all_segments.append(s)
                self.all_tokens.extend(s["tokens"])
        if not self.options.condition_on_previous_text or result.temperature > 0.5 or resumed:
            self.prompt_reset_since = len(self.all_tokens)  # no prompt after a high temperature
        self.seek = seek if seek > w.seek or resumed else w.seek + max(w.size, 1)  # never stall

    def _skip_hallucinations(self, w: Window, segments: list[dict], seek: int) -> tuple[int, list[dict], bool]:
        """openai-whisper's hallucination_silence_threshold: skip silence around anomalous segments."""
        threshold = self.options.hallucination_silence_threshold
        first_segment = timing.next_words_segment(segments)
        if first_segment is not None and timing.is_segment_anomaly(first_segment):
            gap = first_segment["start"] - w.time_offset
            if gap > threshold:  # the first segment may be a hallucination: skip the leading silence
                return w.seek + round(gap * FRAMES_PER_SECOND), segments, True
        # skip silence before a possible hallucination surrounded by silence or more hallucinations
        hal_last_end = self.last_speech_timestamp
        for si, segment in enumerate(segments):
            if not segment.get("words"):
                continue
            if timing.is_segment_anomaly(segment):
                next_segment = timing.next_words_segment(segments[si + 1 :])
                hal_next_start = next_segment["words"][0]["start"] if next_segment is not None else w.time_offset + w.duration
                silence_before = (segment["start"] - hal_last_end > threshold or segment["start"] < threshold
                                  or segment["start"] - w.time_offset < 2.0)  # fmt: skip
                silence_after = (hal_next_start - segment["end"] > threshold or timing.is_segment_anomaly(next_segment)
                                 or w.end_time - segment["end"] < 2.0)  # fmt: skip
                if silence_before and silence_after:
                    seek = round(max(w.time_offset + 1, segment["start"]) * FRAMES_PER_SECOND)
                    if self.content_frames / FRAMES_PER_SECOND - segment["end"] < threshold:
                        seek = self.content_frames
                    return seek, segments[:si], False
            hal_last_end = segment["end"]
        return seek, segments, False


def _is_silence(result: DecodingResult, options: TranscribeOptions) -> bool:
    """openai's no-speech rule: <|nospeech|> likely and the text not confident."""
    if options.no_speech_threshold is None or result.no_speech_prob <= options.no_speech_threshold:
        return False
    return options.logprob_threshold is None or result.avg_logprob <= options.logprob_threshold

def _split_segments(result: DecodingResult, tokenizer: Tokenizer, seek: int, segment_size: int) -> tuple[list[dict], int, bool]:
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
        }  # fmt: skip

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


def teacher_forced(model: WhisperaneModel, enc: EncodedWindow, texts: list[list[int]],
                   tokenizer: Tokenizer) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """(probability of each text token [n], alignment weights [A, T, F]) of each window's text tokens, all
    rows in one decoder call (``enc`` holds one window per row). openai's pass: sot sequence, no_timestamps,
    the text, eot (no prompt, no timestamps); shorter rows are padded after their end, which the causal
    attention keeps from changing their own positions."""
    sequences = [[*tokenizer.sot_sequence, tokenizer.no_timestamps, *text, tokenizer.eot] for text in texts]
    longest, scored = max(map(len, sequences)), max(map(len, texts))
    tokens = np.asarray([seq + [seq[-1]] * (longest - len(seq)) for seq in sequences])
    targets = np.asarray([text + [0] * (scored - len(text)) for text in texts])
    first = len(tokenizer.sot_sequence)  # no_timestamps' position predicts the first text token
    with model.decoding_state(len(sequences)) as state:
        probs, weights = model.decoder.score(state, tokens, enc.cross, first, targets, tokenizer.eot)
    rows = enumerate(zip(texts, sequences, strict=True))
    return [(probs[r, : len(text)], weights[r, :, : len(seq)]) for r, (text, seq) in rows]


def _add_words(model, enc, result, segments, tokenizer: Tokenizer, options, time_offset, num_frames, last_speech) -> None:
    """Word timestamps of a window's segments."""
    text_tokens = [t for s in segments for t in s["tokens"] if t < tokenizer.eot]
    if not text_tokens or num_frames < INPUT_STRIDE:  # under one encoder frame of audio: nothing to align to
        for s in segments:
            s["words"] = []
        return
    if options.alignment == "decode" and result.alignment is not None:
        # Rows gathered while decoding predict every sampled token (timestamps included): keep those of text.
        rows = [i for i, t in enumerate(result.tokens) if t < tokenizer.eot] + [len(result.tokens)]
        weights = result.alignment[:, rows]
        probs = np.exp([result.token_logprobs[i] for i in rows[:-1]])
        alignment = timing.find_alignment(weights, text_tokens, probs, num_frames, tokenizer)
    else:
        probs, weights = teacher_forced(model, enc, [text_tokens], tokenizer)[0]
        first = len(tokenizer.sot_sequence)
        alignment = timing.find_alignment(weights, text_tokens, probs, num_frames, tokenizer, first_row=first)
    timing.add_word_timestamps(
        segments, alignment, time_offset=time_offset, last_speech_timestamp=last_speech,
        prepend_punctuations=options.prepend_punctuations, append_punctuations=options.append_punctuations,
        eot=tokenizer.eot,
    )  # fmt: skip


def _segment(s: dict, with_words: bool) -> Segment:
    words = None
    if with_words:
        words = tuple(Word(w["word"], float(w["start"]), float(w["end"]), round(float(w["probability"]), 4)) for w in s.get("words", []))
    return Segment(
        id=s["id"], seek=int(s["seek"]), start=round(float(s["start"]), 3), end=round(float(s["end"]), 3), text=s["text"],
        tokens=tuple(int(t) for t in s["tokens"]), temperature=float(s["temperature"]),
        avg_logprob=float(s["avg_logprob"]), compression_ratio=float(s["compression_ratio"]),
        no_speech_prob=float(s["no_speech_prob"]), words=words,
    )  # fmt: skip


__all__ = ["Segment", "TranscribeOptions", "TranscriptionResult", "Word", "transcribe"]
