"""Long-form transcription: openai-whisper's seek loop over 30 s windows, with word timestamps.

Audio is read through a bounded stream (``audio.open_audio``), so memory does not grow with its length.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from . import timing
from .audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, AudioStream, open_audio
from .decoding import DecodingOptions, DecodingResult, decode, detect_language
from .errors import WhisperaneError
from .model import EncodedWindow, WhisperaneModel, load_model
from .tokenizer import Tokenizer

TIME_PRECISION = 0.02
INPUT_STRIDE = N_FRAMES // 1500  # mel frames per encoder frame / timestamp token


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


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    task: str = "transcribe"
    word_timestamps: bool = True
    temperature: float | Sequence[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    prefix: str | None = None
    clip_timestamps: str | Sequence[float] = "0"
    hallucination_silence_threshold: float | None = None
    prepend_punctuations: str = timing.PREPEND_PUNCTUATIONS
    append_punctuations: str = timing.APPEND_PUNCTUATIONS
    best_of: int | None = 5
    suppress_tokens: str | Sequence[int] | None = "-1"
    suppress_blank: bool = True
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    prefill: str = "exact"  # or "table" (WhisperKit's prefill lookup table)
    alignment: str = "teacher-forced"  # word-timing rows: "teacher-forced" pass or "decode" (gathered while decoding)


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

    ``kwargs`` are the fields of :class:`TranscribeOptions`. ``progress(seconds_done, duration)`` is called
    after each window.
    """
    unknown = set(kwargs) - set(TranscribeOptions.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown transcribe option(s): {', '.join(sorted(unknown))}")
    options = TranscribeOptions(language=language, task=task, word_timestamps=word_timestamps, **kwargs)
    m = model if isinstance(model, WhisperaneModel) else load_model(model)
    stream = audio if isinstance(audio, AudioStream) else open_audio(audio)
    try:
        return _transcribe(m, stream, options, progress)
    finally:
        if stream is not audio:
            stream.close()


SILENCE_PEAK = 1e-4  # -80 dBFS: below any recorded speech; such a window holds nothing to transcribe


def _window(model: WhisperaneModel, stream: AudioStream, seek: int, n_frames: int) -> tuple[EncodedWindow | None, np.ndarray]:
    """Encode the window at ``seek``; None for digital silence, where Whisper is known to invent " you"
    (with a no-speech probability that the log-probability rule overrides). Also returns the samples."""
    start = seek * HOP_LENGTH
    samples = stream.read(start, min(n_frames * HOP_LENGTH, N_SAMPLES))
    peak = float(np.abs(samples).max()) if len(samples) else 0.0
    if peak < SILENCE_PEAK:
        return None, samples
    return model.encode(model.log_mel(samples)), samples


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
        words = segment.get("words")
        if words:
            segment["start"], segment["end"] = words[0]["start"], words[-1]["end"]


def _clip_ranges(clip_timestamps: str | Sequence[float], content_frames: int) -> list[tuple[int, int]]:
    try:
        if isinstance(clip_timestamps, str):
            values = [float(x) for x in clip_timestamps.split(",") if x.strip()] if clip_timestamps else []
        else:
            values = [float(x) for x in clip_timestamps]
    except (TypeError, ValueError):
        raise WhisperaneError(f"clip_timestamps must be comma-separated seconds, not {clip_timestamps!r}") from None
    if not values:
        values = [0.0]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise WhisperaneError("clip_timestamps must be finite, non-negative seconds")
    frames = [round(v * FRAMES_PER_SECOND) for v in values]
    if len(frames) % 2 == 1:
        frames.append(content_frames)
    return [(min(s, content_frames), min(e, content_frames)) for s, e in zip(frames[::2], frames[1::2], strict=True)]


def _decode_with_fallback(model, enc, options: TranscribeOptions, prompt, language, tokenizer, language_probs, seed):
    """Decode at each temperature in turn until a result passes the compression-ratio and log-probability
    checks. When none does, the result with the best average log-probability among those not too repetitive
    (else among all) is kept, as faster-whisper does: openai-whisper keeps the last, highest-temperature one,
    which on a fragile window (a fraction of a second of tail audio) is the most likely to be noise."""
    temperatures = [options.temperature] if isinstance(options.temperature, (int, float)) else list(options.temperature)
    tried: list[DecodingResult] = []
    for t in temperatures:
        opts = DecodingOptions(
            task=options.task, language=language, temperature=t, best_of=options.best_of if t > 0 else None,
            prompt=prompt or None, prefix=options.prefix, suppress_tokens=options.suppress_tokens,
            suppress_blank=options.suppress_blank, without_timestamps=options.without_timestamps,
            max_initial_timestamp=options.max_initial_timestamp, prefill=options.prefill, seed=seed,
        )  # fmt: skip
        result = decode(model, enc, opts, tokenizer, language_probs)
        tried.append(result)
        needs_fallback = False
        if options.compression_ratio_threshold is not None and result.compression_ratio > options.compression_ratio_threshold:
            needs_fallback = True  # too repetitive
        if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
            needs_fallback = True  # average log probability is too low
        if (
            options.no_speech_threshold is not None
            and result.no_speech_prob > options.no_speech_threshold
            and options.logprob_threshold is not None
            and result.avg_logprob < options.logprob_threshold
        ):  # silence; a confident result (a loop at a tail of audio, say) still falls back (openai-whisper's
            # rule since late 2024, and faster-whisper's)
            needs_fallback = False
        if not needs_fallback:
            return result
    threshold = options.compression_ratio_threshold
    not_repetitive = [r for r in tried if threshold is None or r.compression_ratio <= threshold]
    return max(not_repetitive or tried, key=lambda r: r.avg_logprob)


def _transcribe(model: WhisperaneModel, stream: AudioStream, options: TranscribeOptions, progress) -> TranscriptionResult:
    if options.task not in ("transcribe", "translate"):
        raise WhisperaneError(f"unknown task {options.task!r}; use transcribe or translate")
    if not model.is_multilingual and options.task == "translate":
        raise WhisperaneError("English-only models cannot translate; use a multilingual model")
    if not model.is_multilingual and options.language not in (None, "en", "english"):
        raise WhisperaneError(f"English-only models transcribe English only, not {options.language!r}")
    if options.word_timestamps and options.alignment not in ("teacher-forced", "decode"):
        raise WhisperaneError("alignment must be teacher-forced or decode")

    # Total length: exact for arrays and wav/flac; from the header for mp3 (refined as the stream is read).
    content_frames = int(stream.n_samples // HOP_LENGTH)
    if stream.n_samples == 0:
        raise WhisperaneError(f"{stream.name}: the audio holds no samples")
    duration = stream.n_samples / SAMPLE_RATE

    language = options.language
    language_probs = None
    tokenizer = model.tokenizer(language=language if model.is_multilingual else None, task=options.task)
    first_window = None  # (frames, encoding, samples) of the window at seek 0, encoded for language detection
    if model.is_multilingual and language is None:
        # The same frames the first window of the loop reads, so that the loop reuses this encoding.
        first_window = (min(N_FRAMES, content_frames), *_window(model, stream, 0, min(N_FRAMES, content_frames)))
        enc = first_window[1]
        if enc is not None:
            language, language_probs = detect_language(model, enc, tokenizer)
        else:  # nothing to detect from: the transcript will be empty
            language, language_probs = "en", None
    tokenizer = model.tokenizer(language=language, task=options.task) if model.is_multilingual else tokenizer
    language = tokenizer.language

    seek_clips = _clip_ranges(options.clip_timestamps, content_frames)
    clip_idx = 0
    seek = seek_clips[0][0]
    all_tokens: list[int] = []
    all_segments: list[dict] = []
    prompt_reset_since = 0
    if options.initial_prompt:
        all_tokens.extend(tokenizer.encode(" " + options.initial_prompt.strip()))
    last_speech_timestamp = 0.0
    window_index = 0

    while clip_idx < len(seek_clips):
        # The stream refines its length as it reads (mp3 headers can be approximate).
        content_frames = max(content_frames, int(stream.n_samples // HOP_LENGTH)) if not stream.exhausted else int(stream.n_samples // HOP_LENGTH)
        seek_clip_start, seek_clip_end = seek_clips[clip_idx]
        seek_clip_end = min(seek_clip_end, content_frames)
        if seek < seek_clip_start:
            seek = seek_clip_start
        if seek >= seek_clip_end:
            clip_idx += 1
            if clip_idx < len(seek_clips):
                seek = seek_clips[clip_idx][0]
            continue
        time_offset = float(seek * HOP_LENGTH / SAMPLE_RATE)
        window_end_time = float((seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE)
        segment_size = min(N_FRAMES, content_frames - seek, seek_clip_end - seek)
        segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
        if first_window is not None and seek == 0 and segment_size == first_window[0]:
            _, enc, samples = first_window
        else:
            enc, samples = _window(model, stream, seek, segment_size)
        first_window = None
        if stream.exhausted:
            content_frames = int(stream.n_samples // HOP_LENGTH)
        if enc is None:
            seek += segment_size
            if progress:
                progress(min(seek, content_frames) / FRAMES_PER_SECOND, content_frames / FRAMES_PER_SECOND)
            continue

        prompt = all_tokens[prompt_reset_since:]
        result = _decode_with_fallback(model, enc, options, prompt, language, tokenizer, language_probs, seed=window_index)
        window_index += 1

        if options.no_speech_threshold is not None:
            should_skip = result.no_speech_prob > options.no_speech_threshold
            if options.logprob_threshold is not None and result.avg_logprob > options.logprob_threshold:
                should_skip = False  # don't skip if the logprob is high enough despite the no-speech prob
            if should_skip:
                seek += segment_size
                if progress:
                    progress(min(seek, content_frames) / FRAMES_PER_SECOND, content_frames / FRAMES_PER_SECOND)
                continue

        previous_seek = seek
        current_segments, seek, single_timestamp_ending = _split_segments(result, tokenizer, seek, segment_size)

        if options.word_timestamps:
            _add_words(model, enc, result, current_segments, tokenizer, options, time_offset, segment_size, last_speech_timestamp)
            _trim_words_to_sound(current_segments, samples, time_offset)
            last_speech_timestamp = _last_speech(current_segments, last_speech_timestamp)
            if not single_timestamp_ending:
                last_word_end = timing.get_end(current_segments)
                if last_word_end is not None and last_word_end > time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)

            if options.hallucination_silence_threshold is not None:
                seek, current_segments, skipped = _hallucination_filter(
                    current_segments, options.hallucination_silence_threshold, time_offset, window_end_time,
                    segment_duration, previous_seek, segment_size, content_frames, seek, last_speech_timestamp, all_segments,
                )  # fmt: skip
                if skipped:
                    if progress:
                        progress(min(seek, content_frames) / FRAMES_PER_SECOND, content_frames / FRAMES_PER_SECOND)
                    continue

        # a segment never ends past the audio, nor starts before the window
        for s in current_segments:
            s["end"] = min(s["end"], duration)
            s["start"] = min(s["start"], s["end"])
        current_segments = [s for s in current_segments if s["start"] != s["end"] and s["text"].strip()]
        for s in current_segments:
            s["id"] = len(all_segments)
            all_segments.append(s)
            all_tokens.extend(s["tokens"])
        if not options.condition_on_previous_text or result.temperature > 0.5:
            prompt_reset_since = len(all_tokens)  # do not feed the prompt tokens if a high temperature was used
        if seek <= previous_seek:  # never stall
            seek = previous_seek + max(segment_size, 1)
        if progress:
            progress(min(seek, content_frames) / FRAMES_PER_SECOND, content_frames / FRAMES_PER_SECOND)

    duration = stream.n_samples / SAMPLE_RATE
    segments = tuple(_segment(s, tokenizer, options.word_timestamps) for s in all_segments)
    text = tokenizer.decode([t for s in all_segments for t in s["tokens"] if t < tokenizer.eot])
    return TranscriptionResult(text=text, language=language, duration=round(duration, 3), segments=segments,
                               language_probs=language_probs)  # fmt: skip


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
            next_seek = seek + (tokens[last_slice - 1] - tb) * INPUT_STRIDE
    else:
        duration = segment_size * HOP_LENGTH / SAMPLE_RATE
        timestamps = [t for t in tokens if t >= tb]
        if timestamps and timestamps[-1] != tb:
            duration = (timestamps[-1] - tb) * TIME_PRECISION  # a single timestamp at the end
        segments.append(new_segment(time_offset, time_offset + duration, tokens))
        next_seek = seek + segment_size
    return segments, next_seek, single_timestamp_ending


def _last_speech(segments: list[dict], last: float) -> float:
    for s in reversed(segments):
        if s.get("words"):
            return s["words"][-1]["end"]
    return last


def _add_words(model, enc, result, segments, tokenizer: Tokenizer, options, time_offset, num_frames, last_speech) -> None:
    text_tokens = [t for s in segments for t in s["tokens"] if t < tokenizer.eot]
    if not text_tokens:
        for s in segments:
            s["words"] = []
        return
    if options.alignment == "decode" and result.alignment is not None:
        # Rows gathered while decoding predict every sampled token (timestamps included): keep those of text.
        rows = [i for i, t in enumerate(result.tokens) if t < tokenizer.eot] + [len(result.tokens)]
        weights = result.alignment[0, rows] if model.alignment_is_mean else result.alignment[:, rows]
        probs = np.exp([result.token_logprobs[i] for i in rows[:-1]])
        alignment = timing.find_alignment(weights, text_tokens, probs, num_frames, tokenizer)
    else:
        seq = [*tokenizer.sot_sequence, tokenizer.no_timestamps, *text_tokens, tokenizer.eot]
        with model.lock:
            state = model.state(1)
            logits, weights = model.forward_tokens(state, np.asarray([seq]), enc)
        first = len(tokenizer.sot_sequence)
        probs = timing.text_token_probabilities(logits[0, first:], text_tokens, tokenizer.eot)
        heads = weights[0][0] if model.alignment_is_mean else weights[0]  # mean only: plain DTW on the mean
        alignment = timing.find_alignment(heads, text_tokens, probs, num_frames, tokenizer, first_row=first)
    timing.add_word_timestamps(
        segments, alignment, time_offset=time_offset, last_speech_timestamp=last_speech,
        prepend_punctuations=options.prepend_punctuations, append_punctuations=options.append_punctuations,
        eot=tokenizer.eot,
    )  # fmt: skip


def _hallucination_filter(segments, threshold, time_offset, window_end_time, segment_duration, previous_seek,
                          segment_size, content_frames, seek, last_speech_timestamp, all_segments):  # fmt: skip
    """openai-whisper's hallucination_silence_threshold: skip silence around anomalous segments."""
    total_duration = content_frames / FRAMES_PER_SECOND
    # if the first segment might be a hallucination, skip leading silence
    first_segment = timing.next_words_segment(segments)
    if first_segment is not None and timing.is_segment_anomaly(first_segment):
        gap = first_segment["start"] - time_offset
        if gap > threshold:
            return previous_seek + round(gap * FRAMES_PER_SECOND), segments, True

    # skip silence before any possible hallucination that is surrounded by silence or more hallucinations
    hal_last_end = last_speech_timestamp
    for si in range(len(segments)):
        segment = segments[si]
        if not segment.get("words"):
            continue
        if timing.is_segment_anomaly(segment):
            next_segment = timing.next_words_segment(segments[si + 1 :])
            hal_next_start = next_segment["words"][0]["start"] if next_segment is not None else time_offset + segment_duration
            silence_before = segment["start"] - hal_last_end > threshold or segment["start"] < threshold or segment["start"] - time_offset < 2.0
            silence_after = (
                hal_next_start - segment["end"] > threshold
                or timing.is_segment_anomaly(next_segment)
                or window_end_time - segment["end"] < 2.0
            )
            if silence_before and silence_after:
                seek = round(max(time_offset + 1, segment["start"]) * FRAMES_PER_SECOND)
                if total_duration - segment["end"] < threshold:
                    seek = content_frames
                return seek, segments[:si], False
        hal_last_end = segment["end"]
    return seek, segments, False


def _segment(s: dict, tokenizer: Tokenizer, with_words: bool) -> Segment:
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
