"""The result of a transcription, as ``transcribe`` returns it: frozen dataclasses whose ``to_dict`` is the
JSON that ``whisperane transcribe`` writes (openai-whisper's keys). The seek loop builds the segments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float
    probability: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Word:
        return SpeakerWord(**d) if "speaker" in d else Word(**d)


@dataclass(frozen=True)
class SpeakerWord(Word):
    """A word with its speaker's label (diarize: "SPEAKER_00", ...); a word of its own class, so the words of a
    transcript without speakers keep their four keys wherever they are written."""

    speaker: str


@dataclass(frozen=True)
class SpeakerTurn:
    """One speaker's stretch of speech (diarize): what an RTTM line holds."""

    speaker: str
    start: float
    end: float




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
    speaker: str | None = None  # with diarize: every segment holds one speaker
    language: str | None = None  # with multilingual: the language its stretch of speech was decoded in

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens"] = list(self.tokens)
        d["words"] = None if self.words is None else [w.to_dict() for w in self.words]
        if self.words is None:
            d.pop("words")
        for optional in ("speaker", "language"):
            if d[optional] is None:
                d.pop(optional)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Segment:
        """The inverse of ``to_dict``: a segment without ``words`` (or with None) has none."""
        words = d.get("words")
        return cls(id=d["id"], seek=d["seek"], start=d["start"], end=d["end"], text=d["text"], tokens=tuple(d["tokens"]),
                   temperature=d["temperature"], avg_logprob=d["avg_logprob"], compression_ratio=d["compression_ratio"],
                   no_speech_prob=d["no_speech_prob"], words=None if words is None else tuple(Word.from_dict(w) for w in words),
                   speaker=d.get("speaker"), language=d.get("language"))


@dataclass(frozen=True)
class TranscriptionResult:
    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...]
    language_probs: dict[str, float] | None = None
    speaker_turns: tuple[SpeakerTurn, ...] | None = None  # with diarize: who spoke when, in time order

    @property
    def speakers(self) -> dict[str, float] | None:
        """Each speaker's total speech time in seconds, in label order (None without diarize)."""
        if self.speaker_turns is None:
            return None
        totals: dict[str, float] = {}
        for turn in self.speaker_turns:
            totals[turn.speaker] = totals.get(turn.speaker, 0.0) + turn.end - turn.start
        return {speaker: round(totals[speaker], 3) for speaker in sorted(totals)}

    @property
    def speaker_summary(self) -> list[dict] | None:
        """``speakers`` as the JSON writes it (and the server's verbose_json): [{"speaker", "duration"}, ...]."""
        speakers = self.speakers
        return None if speakers is None else [{"speaker": k, "duration": v} for k, v in speakers.items()]

    def to_dict(self) -> dict:
        d = {"text": self.text, "language": self.language, "duration": self.duration,
             "segments": [s.to_dict() for s in self.segments]}
        if self.language_probs is not None:
            d["language_probs"] = dict(sorted(self.language_probs.items(), key=lambda kv: -kv[1])[:5])
        if self.speaker_turns is not None:
            d["speakers"] = self.speaker_summary
            d["speaker_turns"] = [asdict(t) for t in self.speaker_turns]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TranscriptionResult:
        """The inverse of ``to_dict``, for a result read back from JSON (a batch row, a saved file); keys
        ``to_dict`` does not write are ignored (a batch row's ``error``, ``sha256``, ...)."""
        turns = d.get("speaker_turns")
        return cls(text=d["text"], language=d["language"], duration=d["duration"],
                   segments=tuple(Segment.from_dict(s) for s in d["segments"]), language_probs=d.get("language_probs"),
                   speaker_turns=None if turns is None else tuple(SpeakerTurn(**t) for t in turns))


def rounded(segment: Segment, segment_id: int) -> Segment:
    """A segment as the result holds it: numbered ``segment_id``, its times rounded to 1 ms and its words'
    probabilities to 4 decimals (the loop keeps them unrounded: vad_filter and batched mode map times after it)."""
    words = None if segment.words is None else tuple(replace(w, probability=round(w.probability, 4)) for w in segment.words)
    return replace(segment, id=segment_id, start=round(segment.start, 3), end=round(segment.end, 3), words=words)


def result_from_segments(segments: Sequence[Segment], tokenizer: Tokenizer, duration: float, language_probs,
                         with_words: bool) -> TranscriptionResult:
    """The result of a whole file from its segments (in audio order); ``with_words``: each segment's words are
    given (an empty tuple for one without), else None."""
    text = tokenizer.decode([t for s in segments for t in s.tokens if t < tokenizer.eot])
    kept = (s if with_words or s.words is None else replace(s, words=None) for s in segments)
    return TranscriptionResult(text=text, language=tokenizer.language, duration=round(duration, 3),
                               segments=tuple(rounded(s, i) for i, s in enumerate(kept)),
                               language_probs=language_probs)
