"""Batched mode: Silero VAD's speech in chunks of at most 30 s, decoded ``batch_size`` at a time.

Per batch of chunks: one encoder call for all of them, one decoder call per step for all of them (each row at
its own cache position, with its own window's cross K/V, timestamp rules and stopping: ``decode_windows``),
the temperature fallback only for the chunks whose greedy result fails, and one teacher-forced alignment call
for all their word timestamps. Chunks are independent (no previous-text prompt), as in faster-whisper's
``BatchedInferencePipeline``; times are mapped from each chunk's speech back onto the original audio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .audio import HOP_LENGTH, SAMPLE_RATE, AudioStream
from .decoding import DecodingResult, decode_windows, detect_language
from .model import EncodedWindow, WhisperaneModel
from .options import TranscribeOptions
from .tokenizer import Tokenizer
from .transcribe import (
    TranscriptionResult,
    _add_words,
    _decode_with_fallback,
    _is_silence,
    _needs_fallback,
    _result,
    _split_segments,
    _trim_words_to_sound,
    alignment_sequence,
    teacher_forced,
)
from .vad import SpeechChunk, VadOptions, get_speech_timestamps, merge_chunks

BATCHED_VAD = {"max_speech_duration_s": 30.0}  # long speech cut at its silences, not mid-word by merge_chunks


def vad_options(options: TranscribeOptions, batched: bool) -> VadOptions:
    values = {**(BATCHED_VAD if batched else {}), **(options.vad_parameters or {})}
    return VadOptions(**values)


def _batches(chunks: Sequence[SpeechChunk], size: int) -> Iterator[list[SpeechChunk]]:
    for i in range(0, len(chunks), size):
        yield list(chunks[i : i + size])


def transcribe_chunked(model: WhisperaneModel, open_stream: Callable[[], AudioStream], options: TranscribeOptions,
                       progress: Callable[[float, float], None] | None = None) -> TranscriptionResult:  # fmt: skip
    """Batched mode over a source opened twice (``open_stream``): once for VAD, once for the chunks' audio."""
    with open_stream() as stream:
        regions = get_speech_timestamps(stream, vad_options(options, batched=True))
        duration = stream.n_samples / SAMPLE_RATE
    chunks = merge_chunks(regions)
    segments: list[dict] = []
    tokenizer, language_probs = None, None
    with open_stream() as stream:
        for batch in _batches(chunks, options.batch_size):
            audio = [chunk.read(stream) for chunk in batch]
            enc = model.encode(np.concatenate([model.log_mel(a) for a in audio]))
            if tokenizer is None:
                tokenizer, language_probs = _language(model, enc, options)
            results = _decode_batch(model, enc, options, tokenizer, language_probs)
            segments.extend(_batch_segments(model, enc, batch, audio, results, tokenizer, options))
            if progress:
                progress(batch[-1].end / SAMPLE_RATE, duration)
    tokenizer = tokenizer or model.tokenizer(options.language or "en", options.task)
    return _result(segments, tokenizer, duration, language_probs, options.word_timestamps)


def _language(model: WhisperaneModel, enc: EncodedWindow, options: TranscribeOptions) -> tuple[Tokenizer, dict | None]:
    """The given language, or the one detected on the first chunk (as faster-whisper's batched pipeline)."""
    language, probs = options.language, None
    if model.is_multilingual and language is None:
        language, probs = detect_language(model, enc.row(0), model.tokenizer())
    return model.tokenizer(language=language, task=options.task), probs


def _decode_batch(model: WhisperaneModel, enc: EncodedWindow, options: TranscribeOptions, tokenizer: Tokenizer,
                  language_probs) -> list[DecodingResult | None]:  # fmt: skip
    """Greedy results for every chunk at once; the chunks that fail openai's checks are decoded again alone at
    the following temperatures. None for a chunk the no-speech rule calls silence."""
    prompt = tokenizer.encode(" " + options.initial_prompt.strip()) if options.initial_prompt else None
    first = options.temperature[0]
    together = decode_windows(model, enc, options.decoding(first, tokenizer.language, prompt, seed=0), tokenizer)
    results: list[DecodingResult | None] = []
    for i, result in enumerate(together):
        if _needs_fallback(result, options):  # only this chunk is decoded again, alone, at the next temperatures
            result = _decode_with_fallback(model, enc.row(i), options, prompt, tokenizer, language_probs, i, [result])
        results.append(None if _is_silence(result, options) else result)
    return results


def _batch_segments(model: WhisperaneModel, enc: EncodedWindow, batch: list[SpeechChunk], audio: list[np.ndarray],
                    results: list[DecodingResult | None], tokenizer: Tokenizer, options: TranscribeOptions) -> list[dict]:  # fmt: skip
    """The chunks' segments and words (one teacher-forced call for all chunks), on the original timeline."""
    window, rows = enc, [i for i, r in enumerate(results) if r is not None]
    split = {i: _split_segments(results[i], tokenizer, 0, batch[i].n_samples // HOP_LENGTH)[0] for i in rows}
    spoken = [i for i in rows if any(t < tokenizer.eot for s in split[i] for t in s["tokens"])]
    forced = {}
    if options.word_timestamps and spoken and options.alignment == "teacher-forced":
        if len(spoken) < enc.embeds.shape[0]:  # only the chunks with text (a copy of their K/V, once a batch)
            cross = type(enc.cross)({k: v[spoken] for k, v in enc.cross.feeds.items()}, len(spoken))
            enc = EncodedWindow(enc.embeds[spoken], cross)
        sequences = [alignment_sequence(split[i], tokenizer) for i in spoken]
        forced = dict(zip(spoken, teacher_forced(model, enc, sequences), strict=True))
    segments = []
    for i in rows:
        frames = batch[i].n_samples // HOP_LENGTH
        if options.word_timestamps:
            _add_words(model, window.row(i), results[i], split[i], tokenizer, options, 0.0, frames, 0.0, forced.get(i))
            _trim_words_to_sound(split[i], audio[i], 0.0)  # as the sequential loop refines them
        segments.extend(_on_original_timeline(split[i], batch[i]))
    return segments


def _on_original_timeline(segments: list[dict], chunk: SpeechChunk) -> list[dict]:
    for s in segments:
        s["seek"] = round(chunk.start / HOP_LENGTH)
        for w in s.get("words") or []:
            w["start"] = round(chunk.original_time(w["start"]), 3)
            w["end"] = round(chunk.original_time(w["end"], is_end=True), 3)
        words = s.get("words")
        s["start"] = words[0]["start"] if words else chunk.original_time(s["start"])
        s["end"] = words[-1]["end"] if words else chunk.original_time(s["end"], is_end=True)
    timing_order_guard(segments)
    return [s for s in segments if s["text"].strip() and s["start"] < s["end"]]


def timing_order_guard(segments: Sequence[dict]) -> None:
    """A segment never starts before the previous one ends (mapped times of separate regions)."""
    previous = 0.0
    for s in segments:
        s["start"] = max(s["start"], previous)
        s["end"] = max(s["end"], s["start"])
        previous = s["end"]

