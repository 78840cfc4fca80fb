"""One window of the seek loop, start to end (``WindowStep``): decode (with openai's temperature fallback and
no-speech rule) -> segments at timestamp pairs -> word timestamps -> openai's seek rule and hallucination skip
-> the speech guard -> the segments kept, as typed ``Segment`` s. It returns what happened (``WindowOutcome``):
the segments kept, the next seek, whether the guard decodes again from an earlier point, and why. The loops
that drive it (``seek.SeekLoop``, batched mode's lanes through it, a live buffer) keep only the position, the
prompt and the segments so far."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH, INPUT_STRIDE, SAMPLE_RATE, TIME_PRECISION
from ..decoding import DecodingResult, decode
from ..language import LanguageChoice
from ..options import TranscribeOptions
from ..result import Segment, Word
from ..runtime.model import WhisperaneModel
from ..tokenizer import Tokenizer
from .hallucinations import skip_hallucinations
from .speech_guard import SpeechGuard
from .window import Window
from .word_times import heard_words, place_words
from .words import add_words

# Why a window ended as it did (``WindowOutcome.reason``).
DECODED = "decoded"  # its segments kept, the seek moved on (openai's rule)
NO_SPEECH = "no speech"  # openai's no-speech rule: nothing kept, the seek past the window
HALLUCINATION = "hallucination"  # hallucination_silence_threshold: silence before a hallucination skipped
GUARD = "speech guard"  # decoded again from an earlier point (``resume``), the segments before it kept
UNDECODED = "over budget"  # a budgeted decoding failed openai's checks at every temperature it may try: nothing kept


@dataclass(frozen=True)
class WindowOutcome:
    """What one window's step did. ``segments``: the segments kept, in order (ids are the loop's to give; times
    unrounded); ``seek``: where the next window starts; ``window_end``: where the next window ends (the voice
    the guard found without words, decoded alone), None: a whole window; ``resumed``: the guard decodes again
    from ``seek``, a window never guarded again; ``reset_prompt``: the next window is decoded without the text so
    far; ``last_speech``: the end of the last kept word (None: unchanged)."""

    segments: tuple[Segment, ...]
    seek: int
    reason: str
    window_end: int | None = None
    resumed: bool = False
    reset_prompt: bool = False
    last_speech: float | None = None


@dataclass(frozen=True)
class DecodeBudget:
    """Bounds on a window's decoding for a caller that cannot wait for openai's whole fallback (a live update,
    whose buffer the next update decodes again): the first ``1 + fallbacks`` temperatures only, at most
    ``max_tokens`` sampled at each (a decoding that reaches them is no speech: it fails like a loop), and a sample
    whose text starts to loop ended before the loop (``repetition``). Where every decoding fails openai's checks,
    nothing is kept (``UNDECODED``). Files keep openai's fallback."""

    max_tokens: int
    fallbacks: int = 1


class WindowStep:
    """The step of one transcription's windows: the model, the options, the language (chosen on the first window
    that needs it) and the speech guard (None: off) are the call's; each window brings its own prompt and position
    (``__call__``)."""

    def __init__(self, model: WhisperaneModel, options: TranscribeOptions, language: LanguageChoice,
                 guard: SpeechGuard | None):
        self.model, self.options, self.language, self.guard = model, options, language, guard

    def __call__(self, w: Window, prompt: Sequence[int], seed: int, *, may_resume: bool, last_speech: float,
                 content_frames: int, audio_end: float, first: DecodingResult | None = None,
                 budget: DecodeBudget | None = None) -> WindowOutcome:
        """Decode window ``w`` after ``prompt`` (``seed``: the window's index, for sampling; ``first``: its result at
        the first temperature, decoded with other windows). ``may_resume``: the guard may decode it again;
        ``last_speech``: the end of the last word before it; ``content_frames``: the stream's length so far (mel
        frames); ``audio_end``: where the window's audio ends (seconds of the stream); ``budget``: decode it within
        those bounds (``DecodeBudget``) instead of with openai's whole fallback."""
        options = self.options
        tokenizer, language_probs = self.language.of(w.enc)
        if budget is not None:
            result = decode_within(self.model, w.enc, options, prompt, tokenizer, language_probs, seed, budget)
            if result is None:
                return WindowOutcome((), w.seek, UNDECODED)
        else:
            result = decode_with_fallback(self.model, w.enc, options, prompt, tokenizer, language_probs,
                                          seed, [first] if first else [])
        if is_silence(result, options):
            verdict = self.guard.apply(w, None, w.seek, may_resume, bool(prompt), options.word_timestamps) \
                if self.guard else None
            if verdict is None or verdict.resume is None:
                return WindowOutcome((), w.seek + w.size, NO_SPEECH)
            return self._keep(w, result, [], verdict.resume.frame, audio_end, verdict.resume.unheard_end, resumed=True)
        decoded, seek, single_timestamp_ending = split_segments(result, tokenizer, w.seek, w.size)
        if options.word_timestamps:
            add_words(self.model, w.enc, result, decoded, tokenizer, options, w.time_offset, w.size, last_speech)
        segments = [typed_segment(s, options.word_timestamps) for s in decoded]
        if options.word_timestamps:
            segments = heard_words(w, segments, self.guard)
            if not single_timestamp_ending:  # openai's rule: the next window starts where DTW put the last word
                last_word_end = get_end(segments)
                if last_word_end is not None and last_word_end > w.time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)
                    # A segment after the last word lost all its words to the alignment: its audio is decoded
                    # again from the seek, and kept it would come twice, out of order.
                    segments = [s for s in segments if s.words or s.start < last_word_end]
            if options.hallucination_silence_threshold is not None:
                seek, segments, skipped = skip_hallucinations(options.hallucination_silence_threshold, last_speech,
                                                              content_frames, w, segments, seek)
                if skipped:
                    return WindowOutcome((), seek, HALLUCINATION)
        if self.guard is None:
            return self._keep(w, result, segments, seek, audio_end)
        verdict = self.guard.apply(w, segments, seek, may_resume, bool(prompt), options.word_timestamps)
        if verdict.resume is None:
            return self._keep(w, result, verdict.segments, seek, audio_end)
        window_end = verdict.resume.unheard_end if verdict.decode_alone else None
        return self._keep(w, result, verdict.segments, verdict.resume.frame, audio_end, window_end, resumed=True)

    def _keep(self, w: Window, result: DecodingResult, segments: list[Segment], seek: int, audio_end: float,
              window_end: int | None = None, resumed: bool = False) -> WindowOutcome:
        """The window's segments kept (their final word times: ``word_times.place_words``; never ending past the
        window's audio, never empty) and the next seek: past the window's start, unless the guard ``resumed``
        there (it decodes a window again once, without the prompt, and never guards that window again)."""
        last_speech = get_end(segments) if self.options.word_timestamps else None
        if last_speech is not None:  # of the kept segments: a resumed window is aligned again after them
            segments = place_words(w, segments, self.guard)  # refines the reported word times only
        ends = [min(s.end, audio_end) for s in segments]
        kept = tuple(replace(s, start=min(s.start, end), end=end) for s, end in zip(segments, ends, strict=True)
                     if min(s.start, end) != end and s.text.strip())
        reset = not self.options.condition_on_previous_text or result.temperature > 0.5 or resumed
        seek = seek if seek > w.seek or resumed else w.seek + max(w.size, 1)  # never stall
        return WindowOutcome(kept, seek, GUARD if resumed else DECODED, window_end, resumed, reset, last_speech)


def typed_segment(s: dict, with_words: bool) -> Segment:
    """The Segment of a decoded segment (openai's dict, which its placement of the aligned words fills in); times
    and probabilities as computed (``result.rounded`` rounds them for the result)."""
    words = None
    if with_words:
        words = tuple(Word(w["word"], float(w["start"]), float(w["end"]), float(w["probability"]))
                      for w in s.get("words", []))
    return Segment(id=0, seek=int(s["seek"]), start=float(s["start"]), end=float(s["end"]), text=s["text"],
                   tokens=tuple(int(t) for t in s["tokens"]), temperature=float(s["temperature"]),
                   avg_logprob=float(s["avg_logprob"]), compression_ratio=float(s["compression_ratio"]),
                   no_speech_prob=float(s["no_speech_prob"]), words=words)


def get_end(segments: Sequence[Segment]) -> float | None:
    """End of the last word of the segments, else the last segment's end, else None (openai's utils.get_end)."""
    return next((w.end for s in reversed(segments) for w in reversed(s.words or ())),
                segments[-1].end if segments else None)


def decode_with_fallback(model, enc, options: TranscribeOptions, prompt, tokenizer, language_probs, seed,
                          tried: Sequence[DecodingResult] = ()) -> DecodingResult:
    """Decode at each temperature in turn until a result passes the compression-ratio and log-probability
    checks (``tried``: results at the first temperatures, already decoded); a decoding stopped in a loop fails
    the first (``too_repetitive``). When none passes, the result with the best average
    log-probability among those not too repetitive (else among all, a loop's text before the loop) is kept, as
    faster-whisper does: openai-whisper keeps the last, highest-temperature one, which on a fragile window (a
    fraction of a second of tail audio) is the most likely to be noise."""
    tried = list(tried)
    if tried and not _needs_fallback(tried[-1], options):
        return tried[-1]
    for t in options.temperature[len(tried) :]:
        result = decode(model, enc, options.decoding(t, tokenizer.language, prompt, seed), tokenizer, language_probs)
        tried.append(result)
        if not _needs_fallback(result, options):
            return result
    not_repetitive = [r for r in tried if not too_repetitive(r, options)]
    return max(not_repetitive or tried, key=lambda r: r.avg_logprob)


def decode_within(model, enc, options: TranscribeOptions, prompt, tokenizer, language_probs, seed,
                  budget: DecodeBudget) -> DecodingResult | None:
    """openai's fallback within ``budget``: the first result that passes its checks, else None. A decoding stopped
    at a loop is judged on its text before the loop: an update keeps that text, and the next decodes the audio
    after it again."""
    for t in options.temperature[: 1 + budget.fallbacks]:
        decoding = options.decoding(t, tokenizer.language, prompt, seed)
        decoding = replace(decoding, sample_len=budget.max_tokens, stop_at_repetition=True, loop_ratio=None)
        result = decode(model, enc, decoding, tokenizer, language_probs)
        if len(result.tokens) < budget.max_tokens and not _needs_fallback(result, options, loop_fails=False):
            return result
    return None


def _needs_fallback(result: DecodingResult, options: TranscribeOptions, loop_fails: bool = True) -> bool:
    """Too repetitive (a loop too where ``loop_fails``) or too unlikely, unless silence (no-speech probability
    high and the text unlikely: a confident result, a loop at a tail of audio say, still falls back:
    openai-whisper's rule since late 2024, and faster-whisper's)."""
    if options.no_speech_threshold is not None and result.no_speech_prob > options.no_speech_threshold:
        if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
            return False
    if too_repetitive(result, options, loop_fails):
        return True
    return options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold


def too_repetitive(result: DecodingResult, options: TranscribeOptions, loop_fails: bool = True) -> bool:
    """openai's compression-ratio check. A decoding stopped in a loop (``result.looped``, its text before the loop
    kept) fails it where ``loop_fails``: its text had failed it when it stopped, and openai's would have gone on
    with the loop to the token limit."""
    threshold = options.compression_ratio_threshold
    if threshold is None:
        return False
    return result.compression_ratio > threshold or (loop_fails and result.looped)


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
