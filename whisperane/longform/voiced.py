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

A window that openai's no-speech rule passes over is checked too (``voice_in_silence``): the last second of a
sentence before the noise that follows it is judged no speech with the noise, and lost.
"""

from __future__ import annotations

import numpy as np

from ..audio import FRAMES_PER_SECOND
from ..timing import PUNCTUATION
from .guard import GUARD_LEAD_IN_FRAMES, GUARD_TAIL_MIN_FRAMES, Resume, VoiceCheck, resume_before
from .hallucinations import is_segment_anomaly
from .window import Window
from .words import duration_limits

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


def max_word_duration(segments: list[dict]) -> float:
    """openai's max_duration over the window's words (words at an instant counted too)."""
    return duration_limits(np.array([x["end"] - x["start"] for s in segments for x in s.get("words") or []]))[1]


def is_suspect(segment: dict, max_duration: float) -> bool:
    """Word times that look wrong, or no words but punctuation (what the decoder writes into noise)."""
    words = segment.get("words") or []
    stretched = max(STRETCHED_MIN_S, max_duration)
    return (not words or is_segment_anomaly(segment) or any(x["end"] - x["start"] > stretched for x in words)
            or not any(x["word"].strip().strip(PUNCTUATION) for x in words))


def _frames(w: Window, t: float) -> int:
    return round((t - w.time_offset) * FRAMES_PER_SECOND)


def _heard(runs: list[tuple[int, int]], a: int, b: int) -> bool:
    return any(r0 < b + NEAR_VOICE_FRAMES and r1 > a - NEAR_VOICE_FRAMES for r0, r1 in runs)


def _unheard_voice(runs: list[tuple[int, int]], w: Window, word: dict, max_duration: float) -> int:
    """Voiced frames inside a stretched ``word`` beyond what one word holds (``max_duration``; 0 for a word not
    stretched). Counted over the whole word: DTW stretches a word's start back over a pause as often as its end."""
    if word["end"] - word["start"] <= max(STRETCHED_MIN_S, max_duration):
        return 0
    a, b = _frames(w, word["start"]), _frames(w, word["end"])
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
        runs = check.runs(w, _frames(w, start) - NEAR_VOICE_FRAMES, _frames(w, end) + NEAR_VOICE_FRAMES)
        if sum(b - a for a, b in runs) < MIN_VOICE_FRAMES:
            continue  # written into silence or noise
        if not words:
            kept.append(s)
            continue
        at_end = [x for x in words if x["end"] >= w.time_offset + w.duration - WINDOW_END_S]
        unheard = sum(_unheard_voice(runs, w, x, max_duration) for x in at_end)
        if may_resume and unheard >= UNHEARD_MIN_FRAMES:
            start = _frames(w, s["start"])
            resume = resume_before(w, kept + [s], start, max(start + 1, runs[-1][1]), runs[0][0])
            end = min(w.seek + runs[-1][1] + TAIL_FRAMES, w.seek + w.size)
            return kept, Resume(resume.frame, max(end, resume.frame + GUARD_LEAD_IN_FRAMES))
        onto_voice(w, s, runs)
        kept.append(s)
    return kept, None


def onto_voice(w: Window, segment: dict, runs: list[tuple[int, int]]) -> None:
    """Words of a voiced segment that DTW put where no voice comes near (the last word at an instant after the
    voice, a stretched word before it holding that word's voice) are moved to the nearest edge of the voice:
    the text is the decoding's, only the time was wrong."""
    first, last = (w.time_offset + f / FRAMES_PER_SECOND for f in (runs[0][0], runs[-1][1]))
    for x in segment["words"]:
        if _heard(runs, _frames(w, x["start"]), _frames(w, x["end"])):
            continue
        if x["end"] < first:
            x["start"] = x["end"] = round(first, 2)
        else:
            x["start"], x["end"] = round(min(x["start"], last), 2), round(last, 2)
    segment["start"], segment["end"] = segment["words"][0]["start"], segment["words"][-1]["end"]


def voice_in_silence(check: VoiceCheck, w: Window) -> Resume | None:
    """Where to decode again a window judged silence (the no-speech rule) in which the VAD hears
    GUARD_TAIL_MIN_FRAMES of voice or more: from a lead-in before that voice to TAIL_FRAMES after it."""
    runs = check.runs(w, 0, w.held_frames)
    if sum(b - a for a, b in runs) < GUARD_TAIL_MIN_FRAMES:
        return None
    frame = w.seek + max(0, runs[0][0] - GUARD_LEAD_IN_FRAMES)
    end = min(w.seek + runs[-1][1] + TAIL_FRAMES, w.seek + w.size)
    return Resume(frame, max(end, frame + GUARD_LEAD_IN_FRAMES))
