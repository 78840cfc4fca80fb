"""Silero VAD over a stream, scored as the audio arrives: where the voice is, and how long it has paused."""

from __future__ import annotations

import numpy as np

from ..audio import HOP_LENGTH, SAMPLE_RATE
from ..vad.regions import VOICED, VadOptions, speech_regions
from ..vad.regions import WINDOW_SAMPLES as WINDOW  # samples per speech probability (32 ms)
from ..vad.silero import default_vad

# Each new stretch is scored after this much audio before it, so that the model's recurrent state has settled
# (it starts from zeros each call).
WARMUP_SAMPLES = 16 * WINDOW


class VoiceTrack:
    """Speech probabilities of every 32 ms window of one stream since its start."""

    def __init__(self, options: VadOptions | None = None):
        self.options = options or VadOptions()
        self._vad = default_vad()
        self._pending = np.zeros(0, dtype=np.float32)  # samples not yet scored, after the warm-up samples
        self._warmup = np.zeros(0, dtype=np.float32)
        self.probabilities = np.zeros(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> None:
        """Score the whole windows among the samples received so far."""
        self._pending = np.concatenate([self._pending, samples])
        n = len(self._pending) // WINDOW * WINDOW
        if n == 0:
            return
        block = np.concatenate([self._warmup, self._pending[:n]])
        probs, _ = self._vad.speech_probabilities(block)
        new = np.asarray(probs[len(self._warmup) // WINDOW :], dtype=np.float32)
        self.probabilities = np.concatenate([self.probabilities, new])
        self._warmup = block[-WARMUP_SAMPLES:]
        self._pending = self._pending[n:]

    @property
    def scored_samples(self) -> int:
        return len(self.probabilities) * WINDOW

    def has_voice(self, start: int, end: int | None = None) -> bool:
        """Whether any window in samples ``[start, end)`` is speech."""
        a, b = start // WINDOW, None if end is None else -(-end // WINDOW)
        return bool((self.probabilities[a:b] >= self.options.threshold).any())

    def onset_after_pause(self, start: int, pause: int) -> int | None:
        """Where the first voice at or after sample ``start`` begins (its rise above the silence threshold), if at
        least ``pause`` samples of silence (as ``pause_start`` hears it: below that threshold) come before it, the
        silence perhaps beginning before ``start``; else None."""
        p, quiet = self.probabilities, self.probabilities < self.options.silence_threshold
        first = np.flatnonzero(p[start // WINDOW :] >= self.options.threshold)
        if len(first) == 0:
            return None
        rise = int(first[0]) + start // WINDOW
        while rise > 0 and not quiet[rise - 1]:
            rise -= 1
        k = -(-pause // WINDOW)
        return rise * WINDOW if rise >= k and quiet[rise - k : rise].all() else None

    def voiced_frames(self, start: int) -> list[tuple[int, int]]:
        """The voiced runs (vad.VOICED) from sample ``start`` on, in mel frames from ``start``: what the seek
        loop's voice check asks of a buffer that begins there."""
        first = start // WINDOW
        regions = speech_regions(self.probabilities[first:], self.scored_samples - first * WINDOW, VOICED)
        offset = first * WINDOW - start
        runs = [(max(0, (offset + r.start) // HOP_LENGTH), -(-(offset + r.end) // HOP_LENGTH)) for r in regions]
        return [(a, b) for a, b in runs if b > a]

    def voiced_seconds(self) -> float:
        """Seconds of speech windows since the stream began."""
        return float(np.count_nonzero(self.probabilities >= self.options.threshold)) * WINDOW / SAMPLE_RATE

    def pause_start(self) -> int | None:
        """Where the trailing silence begins (a sample), or None while the last scored window is voice: the
        end of the last window at or above the silence threshold, after the last speech window."""
        p = self.probabilities
        voiced = np.flatnonzero(p >= self.options.threshold)
        if len(voiced) == 0:
            return 0
        after = p[voiced[-1] :]
        not_silent = np.flatnonzero(after >= self.options.silence_threshold)
        end = voiced[-1] + int(not_silent[-1]) + 1
        return end * WINDOW if end < len(p) else None

    def pause_seconds(self) -> float:
        start = self.pause_start()
        return 0.0 if start is None else (self.scored_samples - start) / SAMPLE_RATE
