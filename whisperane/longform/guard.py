"""The seek guard: a window whose decoding leaves GUARD_MIN_SPEECH_FRAMES of voice without words (it stopped
early on a timestamp, or jumped over speech) is decoded again from before that voice, once. Silero VAD says
where the voice is: on demand for the stretch in question (``VoiceOnDemand``), or from a VAD pass made
beforehand (``VoiceRegions``)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH, SAMPLE_RATE
from ..errors import WhisperaneError
from .window import Window

# 1.5 s of voiced frames (vad.VOICED) between two words, or before the first or after the last: speech the
# decoding skipped: about twice the longest voiced stretch without words in good transcripts (DTW's word edges
# and pauses the VAD still calls voice), far below the skips seen (benchmarks/results/2026-12-01-guard.md).
GUARD_MIN_SPEECH_FRAMES = 150


# Voice after a window's last word that the seek passes over: 0.5 s, a word or two, is speech lost at the end of
# a sentence (the decoding ended it early on a timestamp); DTW's last word ends at most a few frames early.
GUARD_TAIL_MIN_FRAMES = 50


# A resumed decoding starts this far ahead of the voice it found without words (when that is later than the last
# kept segment's end): the stretch before holds no word and no voice, and a window that begins with seconds of
# digital silence before the voice can make the model write a sentence several times into the silence. The
# lead-in covers the VAD's late onsets after a fricative.
GUARD_LEAD_IN_FRAMES = 100


def heard_frames(segments: list[dict], window_seek: int) -> list[tuple[int, int]]:
    """The frames (from the window's start) that words cover; a segment's own span without word timestamps."""
    spans = []
    for s in segments:
        if s["text"].strip():
            for x in s["words"] if s.get("words") else [s]:
                start, end = (round(x[k] * FRAMES_PER_SECOND) - window_seek for k in ("start", "end"))
                spans.append((start, end))
    return spans


class Voice(NamedTuple):
    """What Silero VAD hears in a stretch of a window: its voiced mel frames, and the first of them (from the
    window's start; the stretch's end when there is none)."""

    frames: int
    onset: int


class VoiceCheck:
    """Where Silero VAD hears voice (vad.VOICED) in a stretch of a window, for the seek guard."""

    def runs(self, w: Window, start: int, end: int) -> list[tuple[int, int]]:
        """The voiced runs ``[a, b)`` in ``[start, end)`` of window ``w``, in order (frames from its start). The
        stretch comes from decoded times, which may point anywhere (before the window, past the audio it
        holds): it is clipped to the window's audio, and an empty stretch has no voice."""
        start, end = max(0, start), min(end, w.held_frames)
        return self.voiced_runs(w, start, end) if end > start else []

    def voiced_runs(self, w: Window, start: int, end: int) -> list[tuple[int, int]]:
        """``runs`` of a stretch inside the window's audio (``0 <= start < end <= w.held_frames``)."""
        raise NotImplementedError

    def voice(self, w: Window, start: int, end: int) -> Voice:
        """The voice in ``[start, end)`` of window ``w``."""
        runs = self.runs(w, start, end)
        return Voice(sum(b - a for a, b in runs), runs[0][0] if runs else end)


class VoiceOnDemand(VoiceCheck):
    """The VAD run on the stretch itself, only when the guard asks (a stretch of GUARD_MIN_SPEECH_FRAMES or more
    without words, or a segment at one instant: ``instants_onto_voice``): most windows of speech have none, so
    the guard costs little (benchmarks/results/2026-12-01-guard.md).

    Without the VAD model (not cached, and PyPI out of reach) the guard is off, with one warning."""

    def __init__(self):
        self.unavailable = False

    def voiced_runs(self, w, start, end):
        from ..vad.regions import VOICED, speech_regions
        from ..vad.silero import default_vad

        if self.unavailable:
            return []
        try:
            vad = default_vad()
        except WhisperaneError as e:
            self.unavailable = True
            warnings.warn(f"speech guard off: {e}", stacklevel=2)
            return []
        probabilities, n_samples = vad.speech_probabilities(w.samples[start * HOP_LENGTH : end * HOP_LENGTH])
        regions = speech_regions(probabilities, n_samples, VOICED)
        # each region's frames rounded up, as the guard has always counted them
        return [(start + r.start // HOP_LENGTH, start + r.start // HOP_LENGTH + -(-r.n_samples // HOP_LENGTH)) for r in regions]


class VoiceRegions(VoiceCheck):
    """Voiced regions known beforehand (vad_filter's VAD pass), in mel frames of the stream."""

    def __init__(self, frames: list[tuple[int, int]]):
        self.frames = frames

    def voiced_runs(self, w, start, end):
        overlaps = [(max(w.seek + start, a) - w.seek, min(w.seek + end, b) - w.seek) for a, b in self.frames]
        return [(a, b) for a, b in overlaps if b > a]

    @classmethod
    def of_speech(cls, stream, voiced: Sequence | None = None) -> VoiceRegions:
        """A SpeechStream's voiced regions on its speech-only timeline (those in removed audio map to nothing);
        ``voiced``: the whole audio's vad.VOICED regions when known (several streams over one VAD pass)."""
        from ..vad.regions import VOICED, speech_regions

        frames = []
        for r in voiced if voiced is not None else speech_regions(stream.probabilities, stream.original_n_samples, VOICED):
            start, end = (stream.time_map.speech_time(t / SAMPLE_RATE) * FRAMES_PER_SECOND for t in (r.start, r.end))
            if end > start:
                frames.append((int(start), math.ceil(end)))
        return cls(frames)


class Resume(NamedTuple):
    """Where the seek guard decodes again (``frame``), and where the voice it found without words ends
    (``unheard_end``: the next word's start, or the seek): both in mel frames of the stream."""

    frame: int
    unheard_end: int


def resume_before(w: Window, segments: list[dict], gap_start: int, gap_end: int, onset: int) -> Resume:
    """Where to decode again for voice without words in ``[gap_start, gap_end)`` (window frames) whose first
    voiced frame is ``onset``: after the last segment that ends before the gap (the window's start if none), or
    GUARD_LEAD_IN_FRAMES before the voice where that is later; never past the start of a segment that is
    dropped to be decoded again."""
    ends = [round(s["end"] * FRAMES_PER_SECOND) for s in segments]
    frame = max([w.seek, *(e for e in ends if e <= w.seek + gap_start)])
    dropped = [round(s["start"] * FRAMES_PER_SECOND) for s, e in zip(segments, ends, strict=True) if e > frame]
    return Resume(max(frame, min([w.seek + onset, *dropped]) - GUARD_LEAD_IN_FRAMES), w.seek + gap_end)


def resume_point(check: VoiceCheck | None, resumed: set[int], w: Window, segments: list[dict],
                 seek: int, tail_min_frames: int = GUARD_MIN_SPEECH_FRAMES) -> Resume | None:
    """The seek guard: where to decode again (without the prompt) when GUARD_MIN_SPEECH_FRAMES of voiced
    audio between the window's start and the next seek produced no word (openai's rule would skip it: a
    decoding that stopped early on a timestamp, or jumped over speech): the end of the last segment before
    that gap, or the window's start. ``check`` says where the voice is (None: no guard). At most once per
    window: not for a window the guard started (``resumed``: their seeks). ``tail_min_frames``: the voice that
    suffices after the last word (GUARD_TAIL_MIN_FRAMES in the default mode)."""
    if check is None or w.seek in resumed or seek <= w.seek:
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
