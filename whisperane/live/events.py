"""What a live stream emits: events, and the final result in ``transcribe()``'s form."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..decoding import compression_ratio
from ..result import Segment, TranscriptionResult, Word
from ..timing import SENTENCE_END_MARKS
from ..tokenizer import Tokenizer

EVENT_TYPES = ("hypothesis", "confirmed", "done")
# Confirmed words further apart than this start a new segment of the final result.
SEGMENT_GAP_S = 1.0


@dataclass(frozen=True)
class StreamEvent:
    """One output of a stream. "confirmed": the newly confirmed words (they never change); "hypothesis": the
    whole unconfirmed tail as now decoded (may change, may be empty); "done": every confirmed word, with the
    final result. Times are on the stream's timeline (seconds from its first sample)."""

    type: str
    text: str
    words: tuple[Word, ...]
    audio_time: float  # seconds of audio received when the event was emitted
    wall_time: float  # seconds since the stream started, on its clock
    result: TranscriptionResult | None = None

    def to_dict(self) -> dict:
        d = {"type": self.type, "text": self.text, "words": [asdict(w) for w in self.words],
             "audio_time": round(self.audio_time, 3), "wall_time": round(self.wall_time, 3)}
        if self.result is not None:
            d["result"] = self.result.to_dict()
        return d


def words_text(words: Sequence[Word]) -> str:
    """The words' text joined (each keeps its leading space, as openai-whisper's words do)."""
    return "".join(w.word for w in words)


def ends_sentence(word: Word) -> bool:
    return word.word.rstrip()[-1:] in SENTENCE_END_MARKS


def result_of(words: Sequence[Word], tokenizer: Tokenizer, duration: float) -> TranscriptionResult:
    """The final result of confirmed words: segments split at sentence ends and at pauses over SEGMENT_GAP_S."""
    groups: list[list[Word]] = []
    for w in words:
        if not groups or ends_sentence(groups[-1][-1]) or w.start - groups[-1][-1].end > SEGMENT_GAP_S:
            groups.append([])
        groups[-1].append(w)
    segments = tuple(_segment(i, group, tokenizer) for i, group in enumerate(groups))
    text = words_text(words)
    return TranscriptionResult(text=text, language=tokenizer.language, duration=round(duration, 3), segments=segments)


def _segment(index: int, words: list[Word], tokenizer: Tokenizer) -> Segment:
    text = words_text(words)
    logprob = sum(_log(w.probability) for w in words) / len(words)
    return Segment(id=index, seek=round(words[0].start * 100), start=words[0].start, end=words[-1].end, text=text,
                   tokens=tuple(tokenizer.encode(text)), temperature=0.0, avg_logprob=round(logprob, 4),
                   compression_ratio=round(compression_ratio(text), 4), no_speech_prob=0.0, words=tuple(words))


def _log(p: float) -> float:
    return math.log(max(p, 1e-10))
