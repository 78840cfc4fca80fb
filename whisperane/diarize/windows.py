"""Speaker embeddings over the speech Silero VAD finds: short windows inside each speech region (never across a
pause), each a partial utterance of 160 mel frames (1.6 s) brought to Resemblyzer's level, embedded by the
speaker encoder. The audio is read region by region in bounded memory: only the windows' spans and embeddings
(1 KiB a window) are kept."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..audio import SAMPLE_RATE, AudioStream
from ..vad.regions import SpeechRegion, VadOptions, speech_regions
from ..vad.silero import SileroVad, default_vad
from .encoder import BATCH, SpeakerEncoder
from .features import power_spectrum, to_mels, volume_gain
from .speaker_model import EMBEDDING_SIZE, HOP_LENGTH, PARTIAL_FRAMES

# Speech regions for speaker turns: a pause of 200 ms ends a region (turns in a conversation are separated by
# such pauses more often than not), and regions keep 60 ms of their edges (Silero's onsets are a little late).
SPEAKER_VAD = VadOptions(min_silence_duration_ms=200, speech_pad_ms=60)
WINDOW_SAMPLES = PARTIAL_FRAMES * HOP_LENGTH  # 1.6 s: the encoder's partial utterance
HOP_SAMPLES = WINDOW_SAMPLES  # windows side by side: overlapping halves cost twice the encoder for the same turns (benchmarks/results/2026-12-06-session34-diarize.md)
# Windows of speech shorter than this (a region under 1 s) embed less reliably: they are not clustered, only assigned
# to the nearest speaker (benchmarks/results/2026-12-06-session34-diarize.md).
RELIABLE_SAMPLES = SAMPLE_RATE


@dataclass(frozen=True)
class SpeechWindows:
    """The speech regions of one audio and its windows: ``spans`` [n, 2] (start, end in samples of the original
    audio, inside one region), ``regions_of`` [n] (the region of each window), ``embeddings`` [n, 256]."""

    regions: tuple[SpeechRegion, ...]
    spans: np.ndarray
    regions_of: np.ndarray
    embeddings: np.ndarray
    duration: float

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def reliable(self) -> np.ndarray:
        """Windows of at least RELIABLE_SAMPLES of speech: those the speakers are found from."""
        return (self.spans[:, 1] - self.spans[:, 0]) >= RELIABLE_SAMPLES


def window_spans(region: SpeechRegion) -> list[tuple[int, int]]:
    """Windows of WINDOW_SAMPLES spread evenly over the region, the first at its start and the last at its end, at
    at most HOP_SAMPLES apart; a region shorter than a window is one window of its own length."""
    length = region.n_samples
    if length <= WINDOW_SAMPLES:
        return [(region.start, region.end)]
    count = -(-(length - WINDOW_SAMPLES) // HOP_SAMPLES) + 1
    starts = np.linspace(region.start, region.end - WINDOW_SAMPLES, count).round().astype(int)
    return [(int(s), int(s) + WINDOW_SAMPLES) for s in starts]


def partial_power(samples: np.ndarray) -> np.ndarray:
    """One partial's power spectra [160, 201] of a window's samples at Resemblyzer's level; a window shorter than
    1.6 s is its audio repeated to fill the partial (the encoder's last state then sees only speech)."""
    if len(samples) < WINDOW_SAMPLES:
        samples = np.resize(samples, WINDOW_SAMPLES)
    gain = volume_gain(samples)
    return power_spectrum(samples * np.float32(gain))[:PARTIAL_FRAMES]


def embed_speech(open_stream, encoder: SpeakerEncoder, vad: SileroVad | None = None,
                 vad_options: VadOptions = SPEAKER_VAD) -> SpeechWindows:
    """Windows and their embeddings over the speech of the audio ``open_stream()`` opens (called twice: the VAD
    reads it once, then its regions are read again)."""
    with open_stream() as stream:
        probabilities, n_samples = (vad or default_vad()).speech_probabilities(stream)
    regions = tuple(speech_regions(probabilities, n_samples, vad_options))
    spans = [(span, index) for index, region in enumerate(regions) for span in window_spans(region)]
    embeddings = np.zeros((len(spans), EMBEDDING_SIZE), dtype=np.float32)
    with open_stream() as stream:
        pending: list[np.ndarray] = []
        done = 0
        for (start, end), _ in spans:
            pending.append(partial_power(read_span(stream, start, end)))
            if len(pending) == BATCH:
                embeddings[done : done + len(pending)] = encoder.embed(to_mels(np.stack(pending), encoder.mel_filters))
                done, pending = done + len(pending), []
        if pending:
            embeddings[done:] = encoder.embed(to_mels(np.stack(pending), encoder.mel_filters))
    return SpeechWindows(regions, np.array([s for s, _ in spans], dtype=np.int64).reshape(-1, 2),
                         np.array([i for _, i in spans], dtype=np.int64), embeddings, n_samples / SAMPLE_RATE)


def read_span(stream: AudioStream, start: int, end: int) -> np.ndarray:
    return stream.read(start, end - start)
