"""The speech guard (the ``speech_guard`` option): no speech dropped, and no words where nobody speaks, judged by
the voice Silero VAD hears (``voice``). Every rule it applies and every constant it tunes is here; the window step
(``step``) calls ``SpeechGuard.apply`` for what to keep and where to decode again, and the word-time stages
(``word_times``) its two rules that move words (``instants_onto_voice`` before the verdict, ``edges_onto_voice``
after it). Each rule takes typed segments (``result.Segment``) and returns new ones.

- **Voice without words** (every mode): a window whose decoding leaves GUARD_MIN_SPEECH_FRAMES of voice without
  words (it stopped early on a timestamp, or jumped over speech) is decoded again from before that voice, without
  the prompt, once (``resume_point``).
- **Words without voice** (the default mode, where the VAD is asked on demand): DTW's word times give a decoding's
  inventions away: text written into silence or noise gets words squeezed to an instant or stretched over seconds,
  and a decoding that stopped before a sentence's end stretches its last word over the speech it did not write.
  Such a segment (openai's anomaly score: improbable, at an instant, very long; or a word longer than
  STRETCHED_MIN_S and twice the window's median word) is checked against the VAD on its own span
  (``check_segments``): without voice it is dropped; with more voice inside a stretched word at the window's end
  than one word holds, the window is decoded again from before it; words with no voice near them are moved onto
  it. A window the no-speech rule passes over is checked too (``voice_in_silence``): the last second of a
  sentence before the noise that follows it is judged no speech with the noise, and lost.
- **Word edges** (the default mode): DTW draws a word's start back over the pause before it and a sentence's last
  words out into the pause after it: a word at a pause, and a stretched word, start where the VAD hears its voice
  begin and end where it ends (``edges_onto_voice``); a segment DTW put at one instant takes the voice beside it
  (``instants_onto_voice``, every mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH
from ..result import Segment, Word
from ..timing import is_punctuation_only
from .hallucinations import is_segment_anomaly
from .voice import VoiceCheck, VoiceOnDemand, VoiceRegions
from .window import Window
from .words import duration_limits, spread_by_characters

# 1.5 s of voiced frames (vad.VOICED) between two words, or before the first or after the last: speech the
# decoding skipped: about twice the longest voiced stretch without words in good transcripts (DTW's word edges
# and pauses the VAD still calls voice), far below the skips seen.
GUARD_MIN_SPEECH_FRAMES = 150

# Voice after a window's last word that the seek passes over: 0.5 s, a word or two, is speech lost at the end of
# a sentence (the decoding ended it early on a timestamp); DTW's last word ends at most a few frames early.
GUARD_TAIL_MIN_FRAMES = 50

# A resumed decoding starts this far ahead of the voice it found without words (when that is later than the last
# kept segment's end): the stretch before holds no word and no voice, and a window that begins with seconds of
# digital silence before the voice can make the model write a sentence several times into the silence. The
# lead-in covers the VAD's late onsets after a fricative.
GUARD_LEAD_IN_FRAMES = 100
# A word is heard when voice lies this close to it: DTW's edges and the VAD's onsets are both about this loose.
NEAR_VOICE_FRAMES = 30

# Less voice than this in a segment's span is none (a click, a breath the VAD scored as voice).
MIN_VOICE_FRAMES = 10

# A word longer than this and than twice the window's median word (openai's max_duration) is stretched.
STRETCHED_MIN_S = 1.0

# Voice in a stretched word beyond the longest word (max_duration) that makes speech undecoded there.
UNHEARD_MIN_FRAMES = 50

# A stretched word hides undecoded speech where it runs to the window's last timestamp (a long word inside the
# window, "1455." read as four syllables, holds its own voice).
WINDOW_END_S = 0.5

# A window decoded again ends this long after the voice of the segment it replaces.
TAIL_FRAMES = 100

# The VAD hears a word at a pause from this far before it (its state settles on the voice before, if the word
# starts in voice) to this far after it; a voice onset is refined against this much of the pause before it.
EDGE_MARGIN_FRAMES = 30

# Words this far apart have a pause between them (DTW gives words in a sentence abutting times; a shorter pause
# moves no edge far).
PAUSE_S = 0.3

# Silero scores 32 ms windows: a voiced window's start may lie up to 3 mel frames before the voice, which begins
# at its first frame this much louder than the frames before the window (the pause's noise floor).
ONSET_WINDOW_FRAMES = 3

ONSET_RISE_DB = 6.0
# Voice that no word covers, enough to hold a segment that DTW put at one instant (the sonnet's "1." had 0.39 s).
INSTANT_MIN_VOICE_FRAMES = 20


class Resume(NamedTuple):
    """Where the speech guard decodes again (``frame``), and where the voice it found without words ends
    (``unheard_end``: the next word's start, or the seek): both in mel frames of the stream."""

    frame: int
    unheard_end: int


def heard_frames(segments: Sequence[Segment], window_seek: int) -> list[tuple[int, int]]:
    """The frames (from the window's start) that words cover; a segment's own span without word timestamps."""
    spans = []
    for s in segments:
        if s.text.strip():
            for x in s.words or [s]:
                spans.append((round(x.start * FRAMES_PER_SECOND) - window_seek, round(x.end * FRAMES_PER_SECOND) - window_seek))
    return spans


def resume_before(w: Window, segments: Sequence[Segment], gap_start: int, gap_end: int, onset: int) -> Resume:
    """Where to decode again for voice without words in ``[gap_start, gap_end)`` (window frames) whose first
    voiced frame is ``onset``: after the last segment that ends before the gap (the window's start if none), or
    GUARD_LEAD_IN_FRAMES before the voice where that is later; never past the start of a segment that is
    dropped to be decoded again."""
    ends = [round(s.end * FRAMES_PER_SECOND) for s in segments]
    frame = max([w.seek, *(e for e in ends if e <= w.seek + gap_start)])
    dropped = [round(s.start * FRAMES_PER_SECOND) for s, e in zip(segments, ends, strict=True) if e > frame]
    return Resume(max(frame, min([w.seek + onset, *dropped]) - GUARD_LEAD_IN_FRAMES), w.seek + gap_end)


def resume_point(check: VoiceCheck | None, may_resume: bool, w: Window, segments: Sequence[Segment],
                 seek: int, tail_min_frames: int = GUARD_MIN_SPEECH_FRAMES) -> Resume | None:
    """The speech guard: where to decode again (without the prompt) when GUARD_MIN_SPEECH_FRAMES of voiced
    audio between the window's start and the next seek produced no word (openai's rule would skip it: a
    decoding that stopped early on a timestamp, or jumped over speech): the end of the last segment before
    that gap, or the window's start. ``check`` says where the voice is (None: no guard). At most once per
    window: never where ``may_resume`` is false (a window the guard started). ``tail_min_frames``: the voice that
    suffices after the last word (GUARD_TAIL_MIN_FRAMES in the default mode)."""
    if check is None or not may_resume or seek <= w.seek:
        return None
    previous_end = 0
    spans = sorted(heard_frames(segments, w.seek))
    for i, (start, end) in enumerate([*spans, (seek - w.seek, seek - w.seek)]):
        gap_end = min(max(start, previous_end), seek - w.seek)
        least = tail_min_frames if i == len(spans) else GUARD_MIN_SPEECH_FRAMES
        if gap_end - previous_end >= least:
            voice = check.voice(w, previous_end, gap_end)
            if voice.frames >= least:
                return resume_before(w, segments, previous_end, gap_end, voice.onset)
        previous_end = max(previous_end, end)
    return None


def max_word_duration(segments: Sequence[Segment]) -> float:
    """openai's max_duration over the window's words (words at an instant counted too)."""
    return duration_limits(np.array([x.end - x.start for s in segments for x in s.words or ()]))[1]


def is_suspect(segment: Segment, max_duration: float) -> bool:
    """Word times that look wrong, or no words but punctuation (what the decoder writes into noise)."""
    words = segment.words or ()
    stretched = max(STRETCHED_MIN_S, max_duration)
    return (not words or is_segment_anomaly(segment) or any(x.end - x.start > stretched for x in words)
            or all(is_punctuation_only(x.word) for x in words))


def _heard(runs: list[tuple[int, int]], a: int, b: int) -> bool:
    return any(r0 < b + NEAR_VOICE_FRAMES and r1 > a - NEAR_VOICE_FRAMES for r0, r1 in runs)


def _unheard_voice(runs: list[tuple[int, int]], w: Window, word: Word, max_duration: float) -> int:
    """Voiced frames inside a stretched ``word`` beyond what one word holds (``max_duration``; 0 for a word not
    stretched). Counted over the whole word: DTW stretches a word's start back over a pause as often as its end."""
    if word.end - word.start <= max(STRETCHED_MIN_S, max_duration):
        return 0
    a, b = w.frame(word.start), w.frame(word.end)
    voiced = sum(max(0, min(b, r1) - max(a, r0)) for r0, r1 in runs)
    return max(0, voiced - round(max_duration * FRAMES_PER_SECOND))


def check_segments(check: VoiceCheck, w: Window, segments: Sequence[Segment],
                   may_resume: bool) -> tuple[list[Segment], Resume | None]:
    """The window's segments kept (voiceless ones dropped, words away from the voice moved onto it) and where to
    decode again (None: nowhere; never where ``may_resume`` is false)."""
    max_duration = max_word_duration(segments)
    kept = []
    for s in segments:
        if not is_suspect(s, max_duration):
            kept.append(s)
            continue
        words = s.words or ()
        start, end = (words[0].start, words[-1].end) if words else (s.start, s.end)
        runs = check.runs(w, w.frame(start) - NEAR_VOICE_FRAMES, w.frame(end) + NEAR_VOICE_FRAMES)
        if sum(b - a for a, b in runs) < MIN_VOICE_FRAMES:
            continue  # written into silence or noise
        if not words:
            kept.append(s)
            continue
        at_end = [x for x in words if x.end >= w.time_offset + w.duration - WINDOW_END_S]
        unheard = sum(_unheard_voice(runs, w, x, max_duration) for x in at_end)
        if may_resume and unheard >= UNHEARD_MIN_FRAMES:
            start = w.frame(s.start)
            resume = resume_before(w, kept + [s], start, max(start + 1, runs[-1][1]), runs[0][0])
            end = min(w.seek + runs[-1][1] + TAIL_FRAMES, w.seek + w.size)
            return kept, Resume(resume.frame, max(end, resume.frame + GUARD_LEAD_IN_FRAMES))
        kept.append(onto_voice(w, s, runs))
    return kept, None


def onto_voice(w: Window, segment: Segment, runs: list[tuple[int, int]]) -> Segment:
    """The voiced ``segment`` with its words that DTW put where no voice comes near (the last words at an instant
    after the voice, a stretched word before them holding their voice) moved onto the voice: the words after the
    last heard word share its span, cut at the voice's end; any other to the nearest edge of the voice. The text
    is the decoding's, only the time was wrong."""
    words = list(segment.words)
    first, last = (round(w.time(f), 2) for f in (runs[0][0], runs[-1][1]))
    heard = [_heard(runs, w.frame(x.start), w.frame(x.end)) for x in words]
    tail = len(words)
    while tail > 0 and not heard[tail - 1]:
        tail -= 1
    if 0 < tail < len(words) and words[tail - 1].start < last:
        words[tail - 1 :] = spread_by_characters(words[tail - 1 :], words[tail - 1].start, last)
        heard[tail:] = [True] * (len(words) - tail)
    for i, (x, is_heard) in enumerate(zip(words, heard, strict=True)):
        if is_heard:
            continue
        if x.end < first:
            words[i] = replace(x, start=first, end=first)
        else:
            words[i] = replace(x, start=min(x.start, last), end=last)
    return replace(segment, words=tuple(words), start=words[0].start, end=words[-1].end)


def voice_in_silence(check: VoiceCheck, w: Window) -> Resume | None:
    """Where to decode again a window judged silence (the no-speech rule) in which the VAD hears
    GUARD_TAIL_MIN_FRAMES of voice or more: from a lead-in before that voice to TAIL_FRAMES after it."""
    runs = check.runs(w, 0, w.held_frames)
    if sum(b - a for a, b in runs) < GUARD_TAIL_MIN_FRAMES:
        return None
    frame = w.seek + max(0, runs[0][0] - GUARD_LEAD_IN_FRAMES)
    end = min(w.seek + runs[-1][1] + TAIL_FRAMES, w.seek + w.size)
    return Resume(frame, max(end, frame + GUARD_LEAD_IN_FRAMES))


def instants_onto_voice(w: Window, segments: Sequence[Segment], voice: VoiceCheck) -> list[Segment]:
    """The segments, each whose words DTW put at one instant (start == end; openai's loop clears it) spread over
    the voice the VAD hears nearest to that instant, a run of INSTANT_MIN_VOICE_FRAMES or more between the words
    before and after it (not the voice running on from their edges), by their characters; its text is kept
    (tiny.en, the sonnet after a VAD cut: "1." decoded between "surpassed." and "From", put 0.43 s after its 0.39 s
    of voice, in the pause). One run: an instant that ends a window must not reach over the voice after it, which
    the next window decodes."""
    words = [x for s in segments for x in s.words or ()]  # the window's words, instants moved as they are met
    placed, first = [], 0
    for s in segments:
        own = s.words or ()
        after = first + len(own)
        if own and s.start == s.end and s.text.strip():
            low = words[first - 1].end if first else w.time_offset
            high = words[after].start if after < len(words) else w.end_time
            run = _unheard_run(voice, w, w.frame(low), w.frame(high), s.start, first == 0, after == len(words))
            if run is not None:
                words[first:after] = spread_by_characters(own, w.time(run[0]), w.time(run[1]))
                s = replace(s, words=tuple(words[first:after]), start=words[first].start, end=words[after - 1].end)
        placed.append(s)
        first = after
    return placed


def _unheard_run(voice: VoiceCheck, w: Window, start: int, end: int, instant: float, from_start: bool,
                 to_end: bool) -> tuple[int, int] | None:
    """The run of voice in ``[start, end)`` (window frames) nearest to ``instant`` (seconds), not running on from
    the words before (unless ``from_start``: none before) or after (unless ``to_end``); None if shorter than
    INSTANT_MIN_VOICE_FRAMES."""
    runs = voice.runs(w, start, end) if end - start >= INSTANT_MIN_VOICE_FRAMES else []
    runs = [(a, b) for a, b in runs if (a > start or from_start) and (b < end or to_end)]
    frame = (instant - w.time_offset) * FRAMES_PER_SECOND
    a, b = min(runs, key=lambda r: max(r[0] - frame, frame - r[1], 0), default=(0, 0))
    return (a, b) if b - a >= INSTANT_MIN_VOICE_FRAMES else None


def edges_onto_voice(check: VoiceCheck, w: Window, segments: Sequence[Segment]) -> list[Segment]:
    """The segments with their words at a pause (after one: the start; before one: the end; a window's first and
    last words, and a stretched word, both) whose edge lies where the VAD hears no voice moved: the start to the
    onset of the voice after it, the end to the end of the voice before it, the words beyond that edge sharing
    the nearest word's span by their characters. The VAD hears each word in question once, with
    EDGE_MARGIN_FRAMES either side."""
    words = [x for s in segments for x in s.words or ()]
    stretched = max(STRETCHED_MIN_S, max_word_duration(segments))
    long = [x.end - x.start > stretched for x in words]
    at_start = [i == 0 or long[i] or x.start - words[i - 1].end >= PAUSE_S for i, x in enumerate(words)]
    at_end = [i == len(words) - 1 or long[i] or at_start[i + 1] for i in range(len(words))]
    spans = [_span(w, x) for x, a, b, s in zip(words, at_start, at_end, long, strict=True) if (a or b) and not s]
    shared = _runs_over(check, w, spans)
    # a stretched word heard alone: Silero's state after the voice before it hears that voice on into the tones
    # or noise the word was stretched over
    runs = [check.runs(w, *_span(w, x)) if s else shared for x, s in zip(words, long, strict=True)]
    for i in range(len(words)):
        if at_start[i]:
            _start_onto_onset(runs[i], w, words, i)
    for i in reversed(range(len(words))):
        if at_end[i]:
            _end_onto_offset(runs[i], w, words, i)
    placed, first = [], 0
    for s in segments:
        after = first + len(s.words or ())
        if after > first:
            s = replace(s, words=tuple(words[first:after]), start=words[first].start, end=words[after - 1].end)
        placed.append(s)
        first = after
    return placed


def _span(w: Window, word: Word) -> tuple[int, int]:
    return w.frame(word.start) - EDGE_MARGIN_FRAMES, w.frame(word.end) + EDGE_MARGIN_FRAMES


def _runs_over(check: VoiceCheck, w: Window, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The voiced runs of the stretches ``spans``, overlapping ones heard as one."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [run for a, b in merged for run in check.runs(w, a, b)]


def _start_onto_onset(runs: list[tuple[int, int]], w: Window, words: list[Word], i: int) -> None:
    """Word ``i`` of ``words`` (the window's, replaced in this list) started at the onset of the voice after it."""
    start, end = w.frame(words[i].start), w.frame(words[i].end) + EDGE_MARGIN_FRAMES
    onsets = [a for a, _ in runs if start < a < end]
    if any(a <= start < b for a, b in runs) or not onsets:
        return
    onset = round(w.time(_rise(w, onsets[0])), 2)
    k = max(j for j in range(i, len(words)) if words[j].start < onset)
    if words[k].end > onset:  # else the VAD's onset lies after the words it should start: not moved
        words[i : k + 1] = spread_by_characters(words[i : k + 1], onset, words[k].end)


def _end_onto_offset(runs: list[tuple[int, int]], w: Window, words: list[Word], i: int) -> None:
    """Word ``i`` of ``words`` (the window's, replaced in this list) ended at the end of the voice before it."""
    start, end = w.frame(words[i].start) - EDGE_MARGIN_FRAMES, w.frame(words[i].end)
    offsets = [b for _, b in runs if start < b < end]
    if any(a < end <= b for a, b in runs) or not offsets:
        return
    offset = round(w.time(offsets[-1]), 2)
    m = min(j for j in range(i + 1) if words[j].end > offset)
    if words[m].start < offset:  # else the VAD's offset lies before the words it should end: not moved
        words[m : i + 1] = spread_by_characters(words[m : i + 1], words[m].start, offset)


def _rise(w: Window, onset: int) -> int:
    """The first frame of the VAD's voiced window at ``onset`` louder by ONSET_RISE_DB than the pause before it."""
    if onset < EDGE_MARGIN_FRAMES or onset + ONSET_WINDOW_FRAMES > w.held_frames:
        return onset
    frames = w.samples[(onset - EDGE_MARGIN_FRAMES) * HOP_LENGTH : (onset + ONSET_WINDOW_FRAMES) * HOP_LENGTH]
    power = np.mean(frames.reshape(-1, HOP_LENGTH).astype(np.float64) ** 2, axis=1)
    floor = float(np.median(power[:EDGE_MARGIN_FRAMES]))
    louder = np.flatnonzero(power[EDGE_MARGIN_FRAMES:] > floor * 10 ** (ONSET_RISE_DB / 10))
    return onset + int(louder[0]) if len(louder) else onset


@dataclass(frozen=True)
class GuardVerdict:
    """What the speech guard makes of a window: the segments kept, where to decode again (None: nowhere) and
    whether the next window holds only the voice found without words (it ends at ``resume.unheard_end``)."""

    segments: list[Segment]
    resume: Resume | None = None
    decode_alone: bool = False


class SpeechGuard:
    """The speech guard of one transcription: where the voice is (``voice``), and whether words are checked
    against it (``check_words``: the default mode, where the VAD is asked on demand; vad_filter and batched mode
    decode the VAD's speech alone already, and their guard looks for voice without words only)."""

    def __init__(self, voice: VoiceCheck, check_words: bool):
        self.voice, self.check_words = voice, check_words
        # voice after the window's last word that sends the guard back: less where words are checked against voice
        self.tail_min_frames = GUARD_TAIL_MIN_FRAMES if check_words else GUARD_MIN_SPEECH_FRAMES

    @classmethod
    def on_demand(cls) -> SpeechGuard | None:
        """The default mode's guard: the VAD run on the stretches in question; None (no guard, openai's loop alone,
        with one warning) where the VAD model cannot be loaded."""
        return cls(VoiceOnDemand(), check_words=True) if VoiceOnDemand.available() else None

    @classmethod
    def over_speech(cls, stream, voiced: Sequence | None = None) -> SpeechGuard:
        """The guard of a loop over a VAD's speech alone (``VoiceRegions.of_speech``)."""
        return cls(VoiceRegions.of_speech(stream, voiced), check_words=False)

    @classmethod
    def of_voiced_frames(cls, frames: list[tuple[int, int]]) -> SpeechGuard:
        """The guard of audio whose voiced runs (mel frames) are known, words checked against them (a live buffer)."""
        return cls(VoiceRegions(frames), check_words=True)

    def apply(self, w: Window, segments: Sequence[Segment] | None, seek: int, may_resume: bool, prompted: bool,
              word_timestamps: bool) -> GuardVerdict:
        """The verdict on window ``w``'s ``segments`` (None: openai's no-speech rule passed over the window) whose
        next seek is ``seek``. ``may_resume``: false for a window the guard started (it is never decoded again);
        ``prompted``: the window was decoded with a prompt (dropping it may change the decoding)."""
        if segments is None:
            resume = voice_in_silence(self.voice, w) if self.check_words and may_resume else None
            return GuardVerdict([], resume, decode_alone=True)
        voiced = None
        if self.check_words and word_timestamps:
            segments, voiced = check_segments(self.voice, w, segments, may_resume)
        resume = resume_point(self.voice, may_resume, w, segments, seek, self.tail_min_frames)
        # the earlier of the two: voice found before the segment the voice check decodes again comes first
        alone = voiced is not None and (resume is None or voiced.frame <= resume.frame)
        resume = voiced if alone else resume
        if resume is None:
            return GuardVerdict(list(segments))
        # Decoded again from there, without the prompt that may have led it astray. Where there was no prompt to
        # drop (a lane's or the file's first window), that would be much the same decoding (from the window's
        # start, or from a lead-in before the voice: it jumped over the same voice again), so the unheard stretch
        # is decoded alone, and the decoding cannot jump over it again.
        kept = [s for s in segments if s.end * FRAMES_PER_SECOND <= resume.frame + 1]
        return GuardVerdict(kept, resume, decode_alone=alone or not prompted)

    def hears_voice(self, w: Window) -> bool:
        """Whether the VAD hears voice (MIN_VOICE_FRAMES or more) anywhere in window ``w``'s audio."""
        return self.voice.voice(w, 0, w.held_frames).frames >= MIN_VOICE_FRAMES

    def heard_words(self, w: Window, segments: Sequence[Segment]) -> list[Segment]:
        """Window ``w``'s decoded segments with their words where the VAD hears them, before the verdict: a segment
        DTW put at one instant on the voice beside it (``instants_onto_voice``, every mode)."""
        return instants_onto_voice(w, segments, self.voice)

    def edges_onto_voice(self, w: Window, segments: Sequence[Segment]) -> list[Segment]:
        """The rule ``edges_onto_voice`` on a window's kept segments, where words are checked against voice."""
        return edges_onto_voice(self.voice, w, segments) if self.check_words else list(segments)
