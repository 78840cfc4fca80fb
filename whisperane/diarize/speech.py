"""Where the speech is, for speaker turns: Silero VAD over the whole audio, joined with the transcript's words.

The words alone miss speech the model wrote nothing for (a language it does not know, a telephone band) and count
as speech the pauses inside their spans; the VAD alone misses quiet or band-limited speech. So the windows are
embedded over both (``embedding_regions``: a speaker with no words is still found), and a turn covers only
``speech_spans``: where the VAD hears speech, and inside a word's span where it hears speech at a lower threshold
(a word is evidence of speech the VAD is unsure of)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..audio import SAMPLE_RATE, AudioStream
from ..result import TranscriptionResult
from ..vad.regions import SpeechRegion, VadOptions, speech_regions
from ..vad.silero import default_vad
from .windows import REGION_GAP

# A pause of 200 ms ends a stretch of speech (as REGION_GAP a region of words); 100 ms of padding keeps the
# soft ends of words the VAD scores low.
SPEECH = VadOptions(min_silence_duration_ms=200, speech_pad_ms=100)
# Inside a word's span, speech at this probability or more (its silence threshold 0.15 below) is speech.
SPEECH_IN_WORDS = VadOptions(threshold=0.3, min_silence_duration_ms=200, speech_pad_ms=100)


def speech_probabilities(stream: AudioStream) -> tuple[np.ndarray, int]:
    """Silero VAD's probability per 32 ms of the audio ``stream`` reads from its start, and the samples read."""
    return default_vad().speech_probabilities(stream)


def joined(spans: Iterable[tuple[int, int]], gap: int = 0) -> tuple[SpeechRegion, ...]:
    """``spans`` (samples) sorted and joined where at most ``gap`` apart."""
    out: list[list[int]] = []
    for start, end in sorted(spans):
        if out and start - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple(SpeechRegion(start, end) for start, end in out if end > start)


def word_spans(result: TranscriptionResult) -> list[tuple[int, int]]:
    """The transcript's words (samples), joined where at most REGION_GAP apart, unpadded."""
    spans = [(round(w.start * SAMPLE_RATE), round(w.end * SAMPLE_RATE)) for s in result.segments
             for w in (s.words or ())]
    return [(r.start, r.end) for r in joined(spans, round(REGION_GAP * SAMPLE_RATE))]


def embedding_regions(word_regions: Sequence[SpeechRegion], vad: Sequence[SpeechRegion]) -> tuple[SpeechRegion, ...]:
    """The regions windows are embedded over: the transcript's (``word_regions``) and the VAD's (``vad_speech``),
    joined."""
    return joined(((r.start, r.end) for r in (*word_regions, *vad)), round(REGION_GAP * SAMPLE_RATE))


def vad_speech(probabilities: np.ndarray, n_samples: int) -> list[SpeechRegion]:
    """The VAD's speech (SPEECH) from its probabilities."""
    return speech_regions(probabilities, n_samples, SPEECH)


def speech_spans(result: TranscriptionResult, vad: Sequence[SpeechRegion], probabilities: np.ndarray,
                 n_samples: int) -> tuple[SpeechRegion, ...]:
    """Where turns may lie: the VAD's speech (``vad_speech``), and its speech at SPEECH_IN_WORDS's threshold inside
    words."""
    softer = [(r.start, r.end) for r in speech_regions(probabilities, n_samples, SPEECH_IN_WORDS)]
    return joined([*((r.start, r.end) for r in vad), *overlaps(softer, word_spans(result))])


def overlaps(first: Sequence[tuple[int, int]], second: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intersection of two sorted lists of disjoint spans."""
    out, i, j = [], 0, 0
    while i < len(first) and j < len(second):
        start, end = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        if start < end:
            out.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return out
