"""Speech regions from Silero VAD's window probabilities: faster-whisper's options (``VadOptions``) and state
machine (``speech_regions``), and the map from speech-only times back to the original audio
(``SpeechTimestampsMap``)."""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..audio import SAMPLE_RATE
from ..errors import OptionsError

WINDOW_SAMPLES = 512  # one speech probability per 32 ms at 16 kHz


# faster-whisper's rule: a region that reaches max_speech_duration_s is cut at a silence of at least this.
MIN_SILENCE_AT_MAX_SPEECH_MS = 98


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's ``VadOptions``: names, defaults and meaning.

    threshold: a window whose speech probability is at least this is speech.
    neg_threshold: while in speech, a window below this is silence (None: ``max(threshold - 0.15, 0.01)``).
    min_speech_duration_ms: speech regions shorter than this are dropped.
    max_speech_duration_s: longer regions are cut at the last silence of at least 98 ms, else hard.
    min_silence_duration_ms: silence shorter than this does not end a region.
    speech_pad_ms: regions are widened by this on each side (half the gap when two are closer).
    """

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def __post_init__(self) -> None:
        for name in ("threshold", "neg_threshold", "min_speech_duration_ms", "max_speech_duration_s",
                     "min_silence_duration_ms", "speech_pad_ms"):
            value = getattr(self, name)
            if value is None and name == "neg_threshold":
                continue
            # bool is an int to Python, and a string or NaN would fail later with a traceback or silently.
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
                raise OptionsError(f"VAD {name} must be a number, got {value!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise OptionsError(f"VAD threshold must be in (0, 1], got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 <= self.neg_threshold <= self.threshold:
            raise OptionsError(f"VAD neg_threshold must be in [0, threshold], got {self.neg_threshold}")
        if not self.max_speech_duration_s > 0:
            raise OptionsError(f"VAD max_speech_duration_s must be > 0, got {self.max_speech_duration_s}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise OptionsError(f"VAD {name} must be a finite number >= 0, got {getattr(self, name)}")

    @property
    def silence_threshold(self) -> float:
        """The neg_threshold in effect."""
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


@dataclass(frozen=True, order=True)
class SpeechRegion:
    """Speech in ``[start, end)``, in samples of the original 16 kHz audio."""

    start: int
    end: int

    @property
    def n_samples(self) -> int:
        return self.end - self.start

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


# Where the VAD hears voice itself, for a check that speech produced words (the speech guard): no padding, and a
# pause of 100 ms ends a region (the defaults' 2 s pauses and 400 ms pads count a sentence break as speech).
VOICED = VadOptions(min_silence_duration_ms=100, speech_pad_ms=0)


def speech_regions(
    probabilities: np.ndarray, n_samples: int, options: VadOptions | None = None
) -> list[SpeechRegion]:
    """faster-whisper's state machine over window probabilities, then its padding."""
    options = options or VadOptions()
    detector = _RegionDetector(options)
    for index, probability in enumerate(np.asarray(probabilities, dtype=np.float64).tolist()):
        detector.step(index * WINDOW_SAMPLES, probability)
    raw = detector.finish(n_samples)
    return _pad_regions(raw, n_samples, SAMPLE_RATE * options.speech_pad_ms / 1000)


class _RegionDetector:
    """The hysteresis state machine of faster-whisper's ``get_speech_timestamps`` (silero-vad's), one window
    at a time. Sample positions are window starts; ``regions`` collects [start, end] before padding."""

    def __init__(self, options: VadOptions):
        pad = SAMPLE_RATE * options.speech_pad_ms / 1000
        self.threshold = options.threshold
        self.silence_threshold = options.silence_threshold
        self.min_speech = SAMPLE_RATE * options.min_speech_duration_ms / 1000
        self.max_speech = SAMPLE_RATE * options.max_speech_duration_s - WINDOW_SAMPLES - 2 * pad
        self.min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
        self.min_silence_at_max = SAMPLE_RATE * MIN_SILENCE_AT_MAX_SPEECH_MS / 1000
        self.regions: list[list[int]] = []
        self.triggered = False
        self.start = 0
        self.temp_end = 0  # where the current silence began (0: none)
        self.prev_end = 0  # the last silence long enough to cut at when the region gets too long
        self.next_start = 0  # where speech resumed after prev_end

    def step(self, sample: int, probability: float) -> None:
        if probability >= self.threshold and self.temp_end:
            self.temp_end = 0
            if self.next_start < self.prev_end:
                self.next_start = sample
        if probability >= self.threshold and not self.triggered:
            self.triggered, self.start = True, sample
            return
        if self.triggered and sample - self.start > self.max_speech:
            if not self._cut_long_region(sample):
                return
        if probability < self.silence_threshold and self.triggered:
            if not self.temp_end:
                self.temp_end = sample
            if sample - self.temp_end > self.min_silence_at_max:
                self.prev_end = self.temp_end
            if sample - self.temp_end >= self.min_silence:
                if self.temp_end - self.start > self.min_speech:
                    self.regions.append([self.start, self.temp_end])
                self.prev_end = self.next_start = self.temp_end = 0
                self.triggered = False

    def _cut_long_region(self, sample: int) -> bool:
        """End a region that reached max_speech; False when faster-whisper skips the rest of the window."""
        if self.prev_end:
            self.regions.append([self.start, self.prev_end])
            # Speech that resumed after that silence continues as a new region.
            if self.next_start < self.prev_end:
                self.triggered = False
            else:
                self.start = self.next_start
            self.prev_end = self.next_start = self.temp_end = 0
            return True
        self.regions.append([self.start, sample])
        self.prev_end = self.next_start = self.temp_end = 0
        self.triggered = False
        return False

    def finish(self, n_samples: int) -> list[list[int]]:
        if self.triggered and n_samples - self.start > self.min_speech:
            self.regions.append([self.start, n_samples])
        return self.regions


def _pad_regions(raw: list[list[int]], n_samples: int, pad: float) -> list[SpeechRegion]:
    """Widen each region by ``pad`` samples, or by half the gap when the next region is closer than 2 pads."""
    for i, region in enumerate(raw):
        if i == 0:
            region[0] = int(max(0, region[0] - pad))
        if i == len(raw) - 1:
            region[1] = int(min(n_samples, region[1] + pad))
            continue
        following = raw[i + 1]
        gap = following[0] - region[1]
        if gap < 2 * pad:
            region[1] += int(gap // 2)
            following[0] = int(max(0, following[0] - gap // 2))
        else:
            region[1] = int(min(n_samples, region[1] + pad))
            following[0] = int(max(0, following[0] - pad))
    return [SpeechRegion(int(start), int(end)) for start, end in raw]


class SpeechTimestampsMap:
    """Times on the speech-only audio (the regions one after another) <-> times on the original audio.

    faster-whisper's ``SpeechTimestampsMap``, without its rounding to 10 ms, plus the inverse mapping.
    """

    def __init__(self, regions: Sequence[SpeechRegion], sample_rate: int = SAMPLE_RATE):
        if not regions:
            raise ValueError("a timestamps map needs at least one speech region")
        self.regions = tuple(regions)
        self.sample_rate = sample_rate
        self._filtered_ends: list[int] = []  # each region's end on the speech-only audio
        self._removed_before: list[int] = []  # samples removed before each region
        filtered = removed = previous_end = 0
        for region in self.regions:
            if region.start < previous_end or region.end <= region.start:
                raise ValueError(f"speech regions must be non-empty, ordered and disjoint: {region}")
            removed += region.start - previous_end
            filtered += region.n_samples
            previous_end = region.end
            self._filtered_ends.append(filtered)
            self._removed_before.append(removed)

    @property
    def n_samples(self) -> int:
        """Length of the speech-only audio."""
        return self._filtered_ends[-1]

    def region_index(self, time: float, is_end: bool = False) -> int:
        """The region a speech-only time falls in; a time on a boundary belongs to the next region unless it
        is an end time."""
        sample = round(time * self.sample_rate)
        if is_end:
            index = bisect.bisect_left(self._filtered_ends, sample)
        else:
            index = bisect.bisect_right(self._filtered_ends, sample)
        return min(index, len(self._filtered_ends) - 1)

    def original_time(self, time: float, region_index: int | None = None, is_end: bool = False) -> float:
        """The original-audio time of a speech-only ``time`` (``region_index`` forces the region, as
        faster-whisper does to keep a word's start and end in one region)."""
        if region_index is None:
            region_index = self.region_index(time, is_end)
        return time + self._removed_before[region_index] / self.sample_rate

    def speech_time(self, original_time: float) -> float:
        """The speech-only time of an original-audio time (one in removed audio goes to the next region's
        start, one after the last region to the end)."""
        sample = round(original_time * self.sample_rate)
        index = bisect.bisect_right([r.end for r in self.regions], sample)
        if index == len(self.regions):
            return self.n_samples / self.sample_rate
        region = self.regions[index]
        return (max(sample, region.start) - self._removed_before[index]) / self.sample_rate
