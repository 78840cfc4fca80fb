"""The result of a transcription, as ``transcribe`` returns it: frozen dataclasses whose ``to_dict`` is the
JSON that ``whisperane transcribe`` writes (openai-whisper's keys), built from the seek loop's segment dicts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


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
             "segments": [s.to_dict() for s in self.segments]}
        if self.language_probs is not None:
            d["language_probs"] = dict(sorted(self.language_probs.items(), key=lambda kv: -kv[1])[:5])
        return d


def segment_from_dict(s: dict, with_words: bool) -> Segment:
    """A Segment from the seek loop's dict of one segment; times rounded to 1 ms, probabilities to 4 decimals."""
    words = None
    if with_words:
        words = tuple(Word(w["word"], float(w["start"]), float(w["end"]), round(float(w["probability"]), 4)) for w in s.get("words", []))
    return Segment(
        id=s["id"], seek=int(s["seek"]), start=round(float(s["start"]), 3), end=round(float(s["end"]), 3), text=s["text"],
        tokens=tuple(int(t) for t in s["tokens"]), temperature=float(s["temperature"]),
        avg_logprob=float(s["avg_logprob"]), compression_ratio=float(s["compression_ratio"]),
        no_speech_prob=float(s["no_speech_prob"]), words=words,
    )


def result_from_segments(segments: list[dict], tokenizer: Tokenizer, duration: float, language_probs, with_words: bool) -> TranscriptionResult:
    """The result of a whole file from its segments (in audio order)."""
    for i, s in enumerate(segments):
        s["id"] = i
    text = tokenizer.decode([t for s in segments for t in s["tokens"] if t < tokenizer.eot])
    return TranscriptionResult(text=text, language=tokenizer.language, duration=round(duration, 3),
                               segments=tuple(segment_from_dict(s, with_words) for s in segments),
                               language_probs=language_probs)
