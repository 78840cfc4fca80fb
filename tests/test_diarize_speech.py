"""The speech speaker turns may cover (whisperane/diarize/speech.py): the VAD's, and inside words the VAD's at a lower
threshold; turns cut to it. Synthetic VAD probabilities and word times: no model needed."""

from __future__ import annotations

import numpy as np

from whisperane.audio import SAMPLE_RATE
from whisperane.result import Segment, TranscriptionResult, Word
from whisperane.vad.regions import WINDOW_SAMPLES, SpeechRegion


def transcript(words: list[tuple[float, float]], duration: float) -> TranscriptionResult:
    segment = Segment(0, 0, words[0][0], words[-1][1], " w" * len(words), (), 0.0, -0.1, 1.0, 0.0,
                      tuple(Word(" w", a, b, 0.9) for a, b in words))
    return TranscriptionResult(segment.text, "en", duration, (segment,))


def probabilities(levels: list[tuple[float, float, float]], duration: float) -> tuple[np.ndarray, int]:
    """VAD probabilities of ``duration`` seconds: ``level`` over each (start, end, level), 0.02 elsewhere."""
    n_samples = int(duration * SAMPLE_RATE)
    p = np.full(-(-n_samples // WINDOW_SAMPLES), 0.02, dtype=np.float32)
    for start, end, level in levels:
        p[int(start * SAMPLE_RATE) // WINDOW_SAMPLES : int(end * SAMPLE_RATE) // WINDOW_SAMPLES] = level
    return p, n_samples


def seconds(regions) -> list[tuple[float, float]]:
    return [(round(r.start / SAMPLE_RATE, 1), round(r.end / SAMPLE_RATE, 1)) for r in regions]


def test_speech_is_the_vads_and_unsure_speech_under_words():
    from whisperane.diarize.speech import speech_spans, vad_speech

    # sure speech 1-3 s with no words (a language the model did not write); unsure speech 5-7 s, words over 5.5-6.5 s
    # only; unsure speech 9-10 s without words; words 12-13 s over no speech at all
    p, n = probabilities([(1, 3, 0.9), (5, 7, 0.4), (9, 10, 0.4)], 15)
    result = transcript([(5.5, 6.0), (6.1, 6.5), (12.0, 13.0)], 15)
    spans = seconds(speech_spans(result, vad_speech(p, n), p, n))
    assert len(spans) == 2
    assert spans[0][0] <= 1.0 and 3.0 <= spans[0][1] <= 3.2  # the VAD's, padded by 0.1 s
    assert spans[1] == (5.5, 6.5)  # the words' span, where the VAD is unsure


def test_embedding_regions_join_words_and_vad():
    from whisperane.diarize.speech import embedding_regions

    words = [SpeechRegion(16000, 32000)]
    vad = [SpeechRegion(34000, 48000), SpeechRegion(80000, 96000)]
    assert embedding_regions(words, vad) == (SpeechRegion(16000, 48000), SpeechRegion(80000, 96000))


def test_turns_are_cut_to_the_speech():
    from whisperane.diarize.turns import inside_speech

    runs = [(0, 100, 0), (100, 300, 1), (300, 400, 0)]
    speech = [SpeechRegion(50, 150), SpeechRegion(250, 350), SpeechRegion(390, 500)]
    assert inside_speech(runs, speech) == [(50, 100, 0), (100, 150, 1), (250, 300, 1), (300, 350, 0), (390, 400, 0)]
    assert inside_speech(runs, []) == []
    assert inside_speech([], speech) == []
