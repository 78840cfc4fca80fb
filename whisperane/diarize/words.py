"""Speakers on a transcript: each word goes to the speaker whose turns cover most of its span (the nearest turn for
a word in a pause), a segment is split wherever its words change speaker, and the turns' boundaries inside speech
move to the pause between the two speakers' words (re-segmentation at word boundaries)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import replace

from ..result import Segment, SpeakerTurn, SpeakerWord, TranscriptionResult, Word
from ..tokenizer import Tokenizer

SNAP_RANGE = 0.5  # seconds: how far a turn boundary inside speech may move to a pause between words


def word_speaker(turns: Sequence[SpeakerTurn], starts: list[float], start: float, end: float) -> str:
    """The speaker covering most of [start, end]; the nearest turn's when none covers any of it."""
    i = bisect.bisect_right(starts, end)
    best, cover = None, 0.0
    for turn in turns[max(0, i - 8) : i]:
        overlap = min(end, turn.end) - max(start, turn.start)
        if overlap > cover:
            best, cover = turn.speaker, overlap
    if best is not None:
        return best
    middle = (start + end) / 2
    nearby = turns[max(0, i - 1) : i + 1]
    return min(nearby, key=lambda t: max(t.start - middle, middle - t.end)).speaker


def labelled_segments(segments: Sequence[Segment], turns: Sequence[SpeakerTurn], tokenizer: Tokenizer) -> list[Segment]:
    """Each segment's words labelled and the segment split at every change of speaker (``piece_tokens``); a segment
    without words takes the speaker covering most of it."""
    starts = [t.start for t in turns]
    out: list[Segment] = []
    for segment in segments:
        if not segment.words:
            out.append(replace(segment, speaker=word_speaker(turns, starts, segment.start, segment.end)))
            continue
        words = [SpeakerWord(w.word, w.start, w.end, w.probability, word_speaker(turns, starts, w.start, w.end))
                 for w in segment.words]
        runs = split_runs(words)
        if len(runs) == 1:
            out.append(replace(segment, words=tuple(words), speaker=words[0].speaker))
            continue
        texts = ["".join(w.word for w in run) for run in runs]
        for k, (run, text, tokens) in enumerate(zip(runs, texts, piece_tokens(segment.tokens, texts, tokenizer),
                                                    strict=True)):
            start = segment.start if k == 0 else run[0].start
            end = segment.end if k == len(runs) - 1 else run[-1].end
            out.append(replace(segment, start=start, end=end, text=text, tokens=tokens, words=tuple(run),
                               speaker=run[0].speaker))
    return [replace(s, id=i) for i, s in enumerate(out)]


def piece_tokens(tokens: Sequence[int], texts: list[str], tokenizer: Tokenizer) -> list[tuple[int, ...]]:
    """The text tokens of each piece of a segment split into ``texts`` (its words' text, in order): the segment's
    own tokens, cut where each piece's bytes end; each piece encoded afresh where its words' text is not its
    tokens' (the encoder's vocabulary is then loaded, once)."""
    text_tokens = [t for t in tokens if t < tokenizer.eot]
    data = [tokenizer.vocabulary.token_bytes[t] for t in text_tokens]
    pieces, k = [], 0
    for text in texts:
        want, got, first = text.encode(), b"", k
        while k < len(data) and len(got) < len(want):
            got, k = got + data[k], k + 1
        if got != want:
            return [tuple(tokenizer.encode(t)) for t in texts]
        pieces.append(tuple(text_tokens[first:k]))
    return pieces


def split_runs(words: list[SpeakerWord]) -> list[list[SpeakerWord]]:
    runs = [[words[0]]]
    for w in words[1:]:
        if w.speaker == runs[-1][-1].speaker:
            runs[-1].append(w)
        else:
            runs.append([w])
    return runs


def snapped_turns(turns: Sequence[SpeakerTurn], words: Sequence[Word]) -> tuple[SpeakerTurn, ...]:
    """Turns whose boundary with the next speaker's (touching, inside speech) moves to the middle of the pause
    between the last word of the one and the first word of the other, when such a pause is within SNAP_RANGE."""
    out = list(turns)
    ends = [w.end for w in words]
    for k in range(len(out) - 1):
        left, right = out[k], out[k + 1]
        if right.start - left.end > 0.05 or left.speaker == right.speaker:
            continue
        i = bisect.bisect_right(ends, left.end + SNAP_RANGE) - 1
        while i >= 0 and ends[i] >= left.end - SNAP_RANGE:
            if i + 1 < len(words) and getattr(words[i], "speaker", None) == left.speaker and \
                    getattr(words[i + 1], "speaker", None) == right.speaker:
                cut = round((words[i].end + words[i + 1].start) / 2, 3)
                if left.start < cut < right.end:
                    out[k], out[k + 1] = replace(left, end=cut), replace(right, start=cut)
                break
            i -= 1
    return tuple(out)


def with_speakers(result: TranscriptionResult, turns: Sequence[SpeakerTurn], tokenizer: Tokenizer) -> TranscriptionResult:
    """``result`` with a speaker on every word and segment and its speaker turns (re-cut at word boundaries)."""
    if not turns:  # no speech found: words the decoder heard anyway are one speaker's, over their own span
        if not result.segments:
            return replace(result, speaker_turns=())
        turns = (SpeakerTurn("SPEAKER_00", result.segments[0].start, result.segments[-1].end),)
    segments = labelled_segments(result.segments, turns, tokenizer)
    words = [w for s in segments for w in s.words or ()]
    return replace(result, segments=tuple(segments), speaker_turns=snapped_turns(turns, words))
