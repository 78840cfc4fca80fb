"""openai-whisper's ``hallucination_silence_threshold``: segments whose words look hallucinated (improbable, very
short or very long) are skipped with the silence around them."""

from __future__ import annotations

from collections.abc import Sequence

from ..audio import FRAMES_PER_SECOND
from ..result import Segment, Word
from ..timing import PUNCTUATION
from .window import Window


def word_anomaly_score(word: Word) -> float:
    """How implausible a word is: improbable, very short (< 0.133 s) or very long (> 2 s)."""
    probability = word.probability
    duration = word.end - word.start
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: Segment | None) -> bool:
    """A segment whose first 8 non-punctuation words look hallucinated."""
    if segment is None or not segment.words:
        return False
    words = [w for w in segment.words if w.word not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: Sequence[Segment]) -> Segment | None:
    """The first segment that has words."""
    return next((s for s in segments if s.words), None)


def skip_hallucinations(threshold: float, last_speech_timestamp: float, content_frames: int, w: Window,
                    segments: list[Segment], seek: int) -> tuple[int, list[Segment], bool]:
    """openai-whisper's hallucination_silence_threshold: skip silence around anomalous segments."""
    first_segment = next_words_segment(segments)
    if first_segment is not None and is_segment_anomaly(first_segment):
        gap = first_segment.start - w.time_offset
        if gap > threshold:  # the first segment may be a hallucination: skip the leading silence
            return w.seek + round(gap * FRAMES_PER_SECOND), segments, True
    # skip silence before a possible hallucination surrounded by silence or more hallucinations
    hal_last_end = last_speech_timestamp
    for si, segment in enumerate(segments):
        if not segment.words:
            continue
        if is_segment_anomaly(segment):
            next_segment = next_words_segment(segments[si + 1 :])
            hal_next_start = next_segment.words[0].start if next_segment is not None else w.time_offset + w.duration
            silence_before = (segment.start - hal_last_end > threshold or segment.start < threshold
                              or segment.start - w.time_offset < 2.0)
            silence_after = (hal_next_start - segment.end > threshold or is_segment_anomaly(next_segment)
                             or w.end_time - segment.end < 2.0)
            if silence_before and silence_after:
                seek = round(max(w.time_offset + 1, segment.start) * FRAMES_PER_SECOND)
                if content_frames / FRAMES_PER_SECOND - segment.end < threshold:
                    seek = content_frames
                return seek, segments[:si], False
        hal_last_end = segment.end
    return seek, segments, False
