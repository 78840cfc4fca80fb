"""Batched mode: the speech found by Silero VAD in ``batch_size`` lanes transcribed side by side.

The speech regions (at most 30 s each) are split into ``batch_size`` lanes of consecutive regions with about
equal speech. Each lane is the sequential loop over its speech alone (as ``vad_filter``): 30 s windows from
the seek, its own previous text as the prompt, the seek guard, openai's rules. The lanes advance together: per
step, the next window of every lane goes through the encoder (a call each, into one reused batch:
``WhisperaneModel.encode_rows`` says why) and through the decoder in one call per token (each row at its own cache position, with its own prompt, cross K/V,
timestamp rules and stopping: ``decoding.decode_windows``); a window whose greedy result fails openai's
checks is decoded again alone at the following temperatures, and the rest of its loop (words, seek) is the
sequential one. Lane boundaries are the only places where a window starts without the previous text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from .audio import SAMPLE_RATE, AudioStream
from .decoding import decode_windows, detect_language
from .model import EncodedWindow, WhisperaneModel
from .options import TranscribeOptions
from .tokenizer import Tokenizer
from .transcribe import Transcription, TranscriptionResult, _empty_result, _result
from .vad import (
    WINDOW_SAMPLES,
    SpeechRegion,
    SpeechStream,
    VadOptions,
    default_vad,
    restore_timestamps,
    speech_regions,
)

BATCHED_VAD = {"max_speech_duration_s": 30.0}  # regions of at most 30 s: lanes are cut at their edges
# A lane starts without previous text: lanes of at least two windows of speech keep that to a few windows
# of a long file (gapped 287 s test file, tiny.en: WER 8.86 % with 8 lanes of ~25 s, 5.23 % with one).
MIN_LANE_SECONDS = 60.0


def vad_options(options: TranscribeOptions, batched: bool) -> VadOptions:
    values = {**(BATCHED_VAD if batched else {}), **(options.vad_parameters or {})}
    return VadOptions(**values)


def lane_regions(regions: Sequence[SpeechRegion], count: int,
                 pauses: Sequence[int] | None = None) -> list[list[SpeechRegion]]:  # fmt: skip
    """At most ``count`` runs of consecutive regions, each of MIN_LANE_SECONDS or more where the speech allows.
    ``pauses[k]``: the silence (VAD windows) between regions k and k + 1 (``pause_lengths``); with them the runs
    end at the longest pauses their lengths allow (``_cuts_at_pauses``), else at equal shares of the speech."""
    before = np.cumsum([0, *(r.n_samples for r in regions)])  # before[k]: the speech ahead of region k
    total = int(before[-1]) or 1
    count = max(1, min(count, int(total / SAMPLE_RATE // MIN_LANE_SECONDS)))
    starts = _cuts_at_pauses(before, count, pauses) if pauses is not None and count > 1 else None
    if starts is None:  # equal shares: a run begins with the first region at or past its share
        firsts = (int(np.searchsorted(before[:-1], j * total / count)) for j in range(count))
        starts = sorted({k for k in firsts if k < len(regions)})
    return [list(regions[a:b]) for a, b in zip(starts, [*starts[1:], len(regions)], strict=True)]


# A lane starts without the previous text and the lane before it stops at the cut: cut where the speaker
# pauses. A pause of GOOD_PAUSE (0.8 s) is as good a cut as a longer one; each lane's speech stays within
# LANE_SPREAD of an equal share (the longest lane sets batched mode's wall time; regions of up to 30 s leave
# little choice within 20 %: on the 609 s benchmark file the only cut outside a sonnet needs a lane 1.3 shares
# long, which takes the same four windows as the longest equal-share lane).
GOOD_PAUSE = 25
LANE_SPREAD = (0.5, 1.3)


def _cuts_at_pauses(before: np.ndarray, count: int, pauses: Sequence[int]) -> list[int] | None:
    """The first region of each of ``count`` runs (``before``: cumulative speech ahead of each region and in all)
    maximising the sum of min(pause, GOOD_PAUSE) at the cuts, then the evenness (the longest run shortest), with
    every run's speech within LANE_SPREAD of an equal share; None when no split keeps to that. Dynamic
    programming over (runs so far, first region of the next run)."""
    n = len(before) - 1
    low, high = (f * before[-1] / count for f in LANE_SPREAD)
    best: list[dict[int, tuple[int, float, int]]] = [{0: (0, 0.0, -1)}]  # best[j][k]: (score, -longest, previous)
    for j in range(1, count + 1):
        row: dict[int, tuple[int, float, int]] = {}
        for k in range(j, n) if j < count else (n,):  # where run j ends (the last run: at the end)
            gain = min(pauses[k - 1], GOOD_PAUSE) if j < count else 0
            first = int(np.searchsorted(before, before[k] - high, side="left"))
            last = int(np.searchsorted(before, before[k] - low, side="right"))
            options = []
            for p in range(first, min(last, k)):  # the runs ending at k whose speech is within the spread
                if p in best[-1]:
                    score, longest, _ = best[-1][p]
                    options.append((score + gain, min(longest, float(before[p] - before[k])), p))
            if options:
                row[k] = max(options)
        best.append(row)
    if n not in best[-1]:
        return None
    starts, k = [], n
    for j in range(count, 0, -1):
        k = best[j][k][2]
        starts.append(k)
    return starts[::-1]


def pause_lengths(regions: Sequence[SpeechRegion], probabilities: np.ndarray, threshold: float) -> list[int]:
    """The silence between each two neighbouring regions, in VAD windows below ``threshold`` around the point
    between them: regions of at most 30 s split long speech at short pauses (often inside a sentence, and
    their padding makes them touch), which is the worst place for a lane to start without the previous text
    and for the lane before it to end (base, 609 s file: a line of a sonnet cut there came out twice)."""
    loud = np.flatnonzero(np.asarray(probabilities) >= threshold)
    lengths = []
    for left, right in zip(regions[:-1], regions[1:], strict=True):
        i = (left.end + right.start) // 2 // WINDOW_SAMPLES
        after = np.searchsorted(loud, i)  # the first loud window at or after i
        if after < len(loud) and loud[after] == i:
            lengths.append(0)
            continue
        first_loud_after = loud[after] if after < len(loud) else len(probabilities)
        last_loud_before = loud[after - 1] if after > 0 else -1
        lengths.append(int(first_loud_after - last_loud_before - 1))
    return lengths


def transcribe_chunked(model: WhisperaneModel, open_stream: Callable[[], AudioStream], options: TranscribeOptions,
                       progress: Callable[[float, float], None] | None = None) -> TranscriptionResult:  # fmt: skip
    """Batched mode over a source opened once for the VAD, then once per lane for its speech."""
    with open_stream() as stream:
        probabilities, n_samples = default_vad().speech_probabilities(stream)
    vad = vad_options(options, batched=True)
    regions = speech_regions(probabilities, n_samples, vad)
    duration = n_samples / SAMPLE_RATE
    if not regions:
        return _empty_result(model, options, duration)
    lanes: list[Transcription] = []
    try:
        for run in lane_regions(regions, options.batch_size, pause_lengths(regions, probabilities, vad.threshold)):
            speech = SpeechStream(open_stream(), run, n_samples, probabilities)
            lanes.append(Transcription.over_speech(model, speech, options, None))
        _run_lanes(model, lanes, options, lambda done: progress and progress(done * duration, duration))
    finally:
        for lane in lanes:
            lane.stream.close()
    segments, voiced = [], probabilities >= vad.threshold
    for lane in lanes:
        restore_timestamps(lane.all_segments, lane.stream.time_map, voiced)
        segments.extend(lane.all_segments)
    return _result(segments, lanes[0].tokenizer, duration, lanes[0].language_probs, options.word_timestamps)


def _run_lanes(model: WhisperaneModel, lanes: list[Transcription], options: TranscribeOptions,
               progress: Callable[[float], None]) -> None:  # fmt: skip
    """Step every lane that has a window left: their windows encoded, decoded greedily in one call per token,
    then each finished by its own loop (fallback, words, seek)."""
    tokenizer = decoding = rows = None
    while batch := [(lane, w) for lane in lanes if (w := lane.next_window()) is not None]:
        rows = model.encode_rows([w.mel for _, w in batch], rows)  # one batch of arrays for every step
        enc = EncodedWindow(rows.first_rows(len(batch)))
        if tokenizer is None:  # the first step: the language, from the first lane's first window
            tokenizer, language_probs = _language(model, enc, options)
            for lane in lanes:
                lane.begin(tokenizer, language_probs)
            decoding = options.decoding(options.temperature[0], tokenizer.language, None, seed=0)
        results = decode_windows(model, enc, decoding, tokenizer, [lane.prompt for lane, _ in batch])
        for i, (lane, w) in enumerate(batch):
            lane.finish_window(replace(w, enc=enc.row(i), mel=None), results[i])
        done = sum(min(lane.seek, lane.content_frames) for lane in lanes)
        progress(done / sum(lane.content_frames for lane in lanes))


def _language(model: WhisperaneModel, enc: EncodedWindow, options: TranscribeOptions) -> tuple[Tokenizer, dict | None]:
    """The given language, or the one detected on the first window of the first lane (the audio's first
    speech, as faster-whisper's batched pipeline)."""
    language, probs = options.language, None
    if model.is_multilingual and language is None:
        language, probs = detect_language(model, enc.row(0), model.tokenizer())
    return model.tokenizer(language=language, task=options.task), probs
