"""Where Silero VAD hears voice (vad.VOICED) in a stretch of a window: asked of the VAD on demand, for the stretch
in question (``VoiceOnDemand``, the default mode), or of a VAD pass made beforehand (``VoiceRegions``: vad_filter,
batched mode, a live stream). The speech guard (``speech_guard``) decides what to do about it."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH, SAMPLE_RATE
from ..errors import WhisperaneError
from .window import Window


class Voice(NamedTuple):
    """What Silero VAD hears in a stretch of a window: its voiced mel frames, and the first of them (from the
    window's start; the stretch's end when there is none)."""

    frames: int
    onset: int


class VoiceCheck:
    """Where Silero VAD hears voice (vad.VOICED) in a stretch of a window."""

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
    """The VAD run on the stretch itself, only when the guard asks (a long stretch without words, a segment whose
    word times look wrong): most windows of speech have none, so the guard costs little."""

    @staticmethod
    def available() -> bool:
        """Whether the VAD model loads (it is cached, or PyPI is in reach); where it does not, one warning: a guard
        without it would find no voice anywhere, and drop every word it checks."""
        from ..vad.silero import default_vad

        try:
            default_vad()
        except WhisperaneError as e:
            warnings.warn(f"speech guard off: {e}", stacklevel=3)
            return False
        return True

    def voiced_runs(self, w, start, end):
        from ..vad.regions import VOICED, speech_regions
        from ..vad.silero import default_vad

        vad = default_vad()
        probabilities, n_samples = vad.speech_probabilities(w.samples[start * HOP_LENGTH : end * HOP_LENGTH])
        regions = speech_regions(probabilities, n_samples, VOICED)
        # a region's partial last frame counts as voiced: the guard's thresholds are set in whole voiced frames
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
