"""Words only where there is voice: the default mode's check of segments whose word times look wrong.

DTW's word times give a decoding's inventions away: text the decoder wrote into silence or noise (often the
previous text again, from the prompt) gets words squeezed to an instant or stretched over seconds, and a
decoding that stopped before a sentence's end stretches its last word over the speech it did not write (over
to the window's last timestamp). Such a segment (openai's anomaly score: improbable, at an instant, very long;
or a word longer than STRETCHED_MIN_S and twice the window's median word) is checked against Silero VAD on its
own span, so the VAD runs on these stretches only:

- no voice in it: the segment is dropped;
- more voice inside a stretched word that runs to the window's end than one word holds (speech after it went
  undecoded): the window is decoded again from before the segment, without the prompt, ending soon after that voice (``Resume``), once;
- words of it with no voice near them (DTW's times, the text right): moved to the nearest edge of its voice.

DTW also draws a word's start back over the pause before it (into the noise, tones or silence between two
sentences), and a sentence's last words out into the pause after it: a word at a pause, and a stretched word,
starts where the VAD hears its voice begin and ends where it ends (``edges_onto_voice``), as batched mode's first
word after a cut does (``words.start_after_cut``).

A window that openai's no-speech rule passes over is checked too (``voice_in_silence``): the last second of a
sentence before the noise that follows it is judged no speech with the noise, and lost.
"""

from __future__ import annotations

import numpy as np

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH
from ..timing import PUNCTUATION
from .guard import GUARD_LEAD_IN_FRAMES, GUARD_TAIL_MIN_FRAMES, Resume, VoiceCheck, resume_before
from .hallucinations import is_segment_anomaly
from .window import Window
from .words import duration_limits, spread_by_characters

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


def max_word_duration(segments: list[dict]) -> float:
    """openai's max_duration over the window's words (words at an instant counted too)."""
    return duration_limits(np.array([x["end"] - x["start"] for s in segments for x in s.get("words") or []]))[1]


def is_suspect(segment: dict, max_duration: float) -> bool:
    """Word times that look wrong, or no words but punctuation (what the decoder writes into noise)."""
    words = segment.get("words") or []
    stretched = max(STRETCHED_MIN_S, max_duration)
    return (not words or is_segment_anomaly(segment) or any(x["end"] - x["start"] > stretched for x in words)
            or not any(x["word"].strip().strip(PUNCTUATION) for x in words))


def _heard(runs: list[tuple[int, int]], a: int, b: int) -> bool:
    return any(r0 < b + NEAR_VOICE_FRAMES and r1 > a - NEAR_VOICE_FRAMES for r0, r1 in runs)


def _unheard_voice(runs: list[tuple[int, int]], w: Window, word: dict, max_duration: float) -> int:
    """Voiced frames inside a stretched ``word`` beyond what one word holds (``max_duration``; 0 for a word not
    stretched). Counted over the whole word: DTW stretches a word's start back over a pause as often as its end."""
    if word["end"] - word["start"] <= max(STRETCHED_MIN_S, max_duration):
        return 0
    a, b = w.frame(word["start"]), w.frame(word["end"])
    voiced = sum(max(0, min(b, r1) - max(a, r0)) for r0, r1 in runs)
    return max(0, voiced - round(max_duration * FRAMES_PER_SECOND))


def check_segments(check: VoiceCheck, w: Window, segments: list[dict],
                   may_resume: bool) -> tuple[list[dict], Resume | None]:
    """The window's segments kept (voiceless ones dropped, words away from the voice moved onto it) and where to
    decode again (None: nowhere; never where ``may_resume`` is false)."""
    max_duration = max_word_duration(segments)
    kept = []
    for s in segments:
        if not is_suspect(s, max_duration):
            kept.append(s)
            continue
        words = s.get("words") or []
        start, end = (words[0]["start"], words[-1]["end"]) if words else (s["start"], s["end"])
        runs = check.runs(w, w.frame(start) - NEAR_VOICE_FRAMES, w.frame(end) + NEAR_VOICE_FRAMES)
        if sum(b - a for a, b in runs) < MIN_VOICE_FRAMES:
            continue  # written into silence or noise
        if not words:
            kept.append(s)
            continue
        at_end = [x for x in words if x["end"] >= w.time_offset + w.duration - WINDOW_END_S]
        unheard = sum(_unheard_voice(runs, w, x, max_duration) for x in at_end)
        if may_resume and unheard >= UNHEARD_MIN_FRAMES:
            start = w.frame(s["start"])
            resume = resume_before(w, kept + [s], start, max(start + 1, runs[-1][1]), runs[0][0])
            end = min(w.seek + runs[-1][1] + TAIL_FRAMES, w.seek + w.size)
            return kept, Resume(resume.frame, max(end, resume.frame + GUARD_LEAD_IN_FRAMES))
        onto_voice(w, s, runs)
        kept.append(s)
    return kept, None


def onto_voice(w: Window, segment: dict, runs: list[tuple[int, int]]) -> None:
    """Words of a voiced segment that DTW put where no voice comes near (the last words at an instant after the
    voice, a stretched word before them holding their voice) are moved onto the voice: the words after the last
    heard word share its span, cut at the voice's end; any other to the nearest edge of the voice. The text is
    the decoding's, only the time was wrong."""
    words = segment["words"]
    first, last = (round(w.time(f), 2) for f in (runs[0][0], runs[-1][1]))
    heard = [_heard(runs, w.frame(x["start"]), w.frame(x["end"])) for x in words]
    tail = len(words)
    while tail > 0 and not heard[tail - 1]:
        tail -= 1
    if 0 < tail < len(words) and words[tail - 1]["start"] < last:
        spread_by_characters(words[tail - 1 :], words[tail - 1]["start"], last)
        heard[tail:] = [True] * (len(words) - tail)
    for x, is_heard in zip(words, heard, strict=True):
        if is_heard:
            continue
        if x["end"] < first:
            x["start"] = x["end"] = first
        else:
            x["start"], x["end"] = min(x["start"], last), last
    segment["start"], segment["end"] = words[0]["start"], words[-1]["end"]


def edges_onto_voice(check: VoiceCheck, w: Window, segments: list[dict]) -> None:
    """Words at a pause (after one: the start; before one: the end; a window's first and last words, and a
    stretched word, both) whose edge lies where the VAD hears no voice: the start moved to the onset of the voice
    after it, the end to the end of the voice before it, the words beyond that edge sharing the nearest word's
    span by their characters. The VAD hears each word in question once, with EDGE_MARGIN_FRAMES either side."""
    words = [x for s in segments for x in s.get("words") or []]
    stretched = max(STRETCHED_MIN_S, max_word_duration(segments))
    long = [x["end"] - x["start"] > stretched for x in words]
    at_start = [i == 0 or long[i] or x["start"] - words[i - 1]["end"] >= PAUSE_S for i, x in enumerate(words)]
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
    for s in segments:
        if s.get("words"):
            s["start"], s["end"] = s["words"][0]["start"], s["words"][-1]["end"]


def _span(w: Window, word: dict) -> tuple[int, int]:
    return w.frame(word["start"]) - EDGE_MARGIN_FRAMES, w.frame(word["end"]) + EDGE_MARGIN_FRAMES


def _runs_over(check: VoiceCheck, w: Window, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The voiced runs of the stretches ``spans``, overlapping ones heard as one."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [run for a, b in merged for run in check.runs(w, a, b)]


def _start_onto_onset(runs: list[tuple[int, int]], w: Window, words: list[dict], i: int) -> None:
    start, end = w.frame(words[i]["start"]), w.frame(words[i]["end"]) + EDGE_MARGIN_FRAMES
    onsets = [a for a, _ in runs if start < a < end]
    if any(a <= start < b for a, b in runs) or not onsets:
        return
    onset = round(w.time(_rise(w, onsets[0])), 2)
    k = max(j for j in range(i, len(words)) if words[j]["start"] < onset)
    if words[k]["end"] > onset:  # else the VAD's onset lies after the words it should start: not moved
        spread_by_characters(words[i : k + 1], onset, words[k]["end"])


def _end_onto_offset(runs: list[tuple[int, int]], w: Window, words: list[dict], i: int) -> None:
    start, end = w.frame(words[i]["start"]) - EDGE_MARGIN_FRAMES, w.frame(words[i]["end"])
    offsets = [b for _, b in runs if start < b < end]
    if any(a < end <= b for a, b in runs) or not offsets:
        return
    offset = round(w.time(offsets[-1]), 2)
    m = min(j for j in range(i + 1) if words[j]["end"] > offset)
    if words[m]["start"] < offset:  # else the VAD's offset lies before the words it should end: not moved
        spread_by_characters(words[m : i + 1], words[m]["start"], offset)


def _rise(w: Window, onset: int) -> int:
    """The first frame of the VAD's voiced window at ``onset`` louder by ONSET_RISE_DB than the pause before it."""
    if onset < EDGE_MARGIN_FRAMES or onset + ONSET_WINDOW_FRAMES > w.held_frames:
        return onset
    frames = w.samples[(onset - EDGE_MARGIN_FRAMES) * HOP_LENGTH : (onset + ONSET_WINDOW_FRAMES) * HOP_LENGTH]
    power = np.mean(frames.reshape(-1, HOP_LENGTH).astype(np.float64) ** 2, axis=1)
    floor = float(np.median(power[:EDGE_MARGIN_FRAMES]))
    louder = np.flatnonzero(power[EDGE_MARGIN_FRAMES:] > floor * 10 ** (ONSET_RISE_DB / 10))
    return onset + int(louder[0]) if len(louder) else onset


def voice_in_silence(check: VoiceCheck, w: Window) -> Resume | None:
    """Where to decode again a window judged silence (the no-speech rule) in which the VAD hears
    GUARD_TAIL_MIN_FRAMES of voice or more: from a lead-in before that voice to TAIL_FRAMES after it."""
    runs = check.runs(w, 0, w.held_frames)
    if sum(b - a for a, b in runs) < GUARD_TAIL_MIN_FRAMES:
        return None
    frame = w.seek + max(0, runs[0][0] - GUARD_LEAD_IN_FRAMES)
    end = min(w.seek + runs[-1][1] + TAIL_FRAMES, w.seek + w.size)
    return Resume(frame, max(end, frame + GUARD_LEAD_IN_FRAMES))
