"""Speaker embeddings over speech regions (the transcript's words, joined where less than REGION_GAP apart:
``transcript_speech``; ``speech.embedding_regions`` adds the VAD's): windows of 1.6 s lie side by side or a little
apart inside each region (never across a pause), each a partial utterance brought to Resemblyzer's level and
embedded by the speaker encoder. The audio is read once (twice where part of it is telephone-band), region by region,
in bounded memory: only the windows' spans and embeddings (1 KiB a window) are kept."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..audio import SAMPLE_RATE, AudioStream
from ..result import TranscriptionResult
from ..vad.regions import SpeechRegion
from .encoder import BATCH, SpeakerEncoder
from .features import band_edge_ratio, band_limited_filters, power_spectrum, to_mels, volume_gain
from .speaker_model import EMBEDDING_SIZE, HOP_LENGTH, PARTIAL_FRAMES

# A pause between two words this long ends a speech region: turns in a conversation are separated by such pauses
# more often than not, and a window never spans one.
REGION_GAP = 0.2
# Word times from the alignment heads start a little late and end a little early: each region is widened by this much
# on either side.
EDGE_PAD = 0.15
WINDOW_SAMPLES = PARTIAL_FRAMES * HOP_LENGTH  # 1.6 s: the encoder's partial utterance
# Windows overlap by a quarter inside a region: more embeddings of a speaker with a few seconds, what lets the count
# find such a speaker, for a fifth more encoder work.
WINDOW_HOP = 3 * WINDOW_SAMPLES // 4
# Consecutive whole windows of one region, up to this long, make one chunk: the points clustered, each the mean of a
# few seconds of one voice, steadier than one window's embedding.
CHUNK_SAMPLES = 4 * SAMPLE_RATE
# Windows shorter than a whole partial (a region under 1.6 s) embed less reliably, the more so as word spans hold
# whatever sound lies between words: they are not clustered, only assigned to the nearest speaker.
RELIABLE_SAMPLES = WINDOW_SAMPLES
# One voice heard through a telephone line and through a wide-band microphone embeds as two voices: the encoder
# weighs the bands the line removes. Where a file holds telephone-band speech, every window's embedding is the mean
# of its full-band one and the one of its TELEPHONE_BAND alone, which a telephone turn and a wide-band turn of one
# voice share. Full-band files keep full-band embeddings: the band limit costs the encoder voices it tells apart
# (noisy files' speakers merge).
TELEPHONE_BAND = (300.0, 3400.0)
# A window is telephone-band where its power above NARROW_ABOVE Hz is under NARROW_RATIO times its power in
# NARROW_EDGE: a line's cut leaves orders of magnitude less there than any full-band speech, even a radio's.
NARROW_EDGE = (2400.0, 3300.0)
NARROW_ABOVE = 3600.0
NARROW_RATIO = 10**-2.5
# The share of windows so judged that makes a file's speech telephone-band in part: a few stray windows (silence,
# a hum) are not a channel.
NARROW_SHARE = 0.1


@dataclass(frozen=True)
class SpeechWindows:
    """The speech regions of one audio and its windows: ``spans`` [n, 2] (start, end in samples of the original
    audio, inside one region), ``regions_of`` [n] (the region of each window), ``embeddings`` [n, 256]."""

    regions: tuple[SpeechRegion, ...]
    spans: np.ndarray
    regions_of: np.ndarray
    embeddings: np.ndarray
    duration: float
    band_mixed: bool = False  # embeddings are mixed_embeddings (the file holds telephone-band speech)

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def reliable(self) -> np.ndarray:
        """Windows of at least RELIABLE_SAMPLES of speech: those the speakers are found from."""
        return (self.spans[:, 1] - self.spans[:, 0]) >= RELIABLE_SAMPLES

    @property
    def chunks(self) -> np.ndarray:
        """The chunk of each reliable window (0, 1, ... in time order; -1 for the others): consecutive reliable
        windows of one region, a chunk spanning at most CHUNK_SAMPLES."""
        out = np.full(len(self), -1, dtype=np.int64)
        chunk, start, region = -1, 0, -1
        for i in np.flatnonzero(self.reliable):
            if self.regions_of[i] != region or self.spans[i, 1] - start > CHUNK_SAMPLES:
                chunk, start, region = chunk + 1, int(self.spans[i, 0]), int(self.regions_of[i])
            out[i] = chunk
        return out


def transcript_speech(result: TranscriptionResult) -> tuple[SpeechRegion, ...]:
    """The speech regions of a transcript: its words' spans (a segment's own where it has no words), joined where
    less than REGION_GAP apart, widened by EDGE_PAD (at most to the middle of the pause beside them), in samples
    inside the audio."""
    spans = [(w.start, w.end) for s in result.segments for w in (s.words or ())]
    spans += [(s.start, s.end) for s in result.segments if not s.words]
    joined: list[list[float]] = []
    for start, end in sorted(spans):
        if joined and start - joined[-1][1] < REGION_GAP:
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([start, end])
    bounds = [-np.inf, *(t for span in joined for t in span), result.duration]
    regions = []
    for k, (start, end) in enumerate(joined):
        before, after = bounds[2 * k], bounds[2 * k + 3]
        start, end = max(start - EDGE_PAD, (before + start) / 2, 0.0), min(end + EDGE_PAD, (end + after) / 2)
        regions.append(SpeechRegion(round(start * SAMPLE_RATE), round(end * SAMPLE_RATE)))
    return tuple(r for r in regions if r.n_samples > 0)


def window_spans(region: SpeechRegion) -> list[tuple[int, int]]:
    """Whole windows of WINDOW_SAMPLES, as many as fit at least WINDOW_HOP apart, spread evenly from the region's
    start to its end (a single one in its middle): the encoder's work is about one partial per WINDOW_HOP of speech.
    A region shorter than a window is one window of its own length."""
    length = region.n_samples
    if length <= WINDOW_SAMPLES:
        return [(region.start, region.end)]
    count = 1 + (length - WINDOW_SAMPLES) // WINDOW_HOP
    if count == 1:
        starts = [region.start + (length - WINDOW_SAMPLES) // 2]
    else:
        starts = np.linspace(region.start, region.end - WINDOW_SAMPLES, count).round().astype(int).tolist()
    return [(int(s), int(s) + WINDOW_SAMPLES) for s in starts]


def partial_power(samples: np.ndarray) -> np.ndarray:
    """One partial's power spectra [160, 201] of a window's samples at Resemblyzer's level; a window shorter than
    1.6 s is its audio repeated to fill the partial (the encoder's last state then sees only speech)."""
    if len(samples) < WINDOW_SAMPLES:
        samples = np.resize(samples, WINDOW_SAMPLES)
    gain = volume_gain(samples)
    return power_spectrum(samples * np.float32(gain))[:PARTIAL_FRAMES]


def embed_speech(open_stream: Callable[[], AudioStream], regions: tuple[SpeechRegion, ...], encoder: SpeakerEncoder,
                 duration: float) -> SpeechWindows:
    """Windows and their embeddings over ``regions`` (in time order) of the audio ``open_stream()`` reads, once;
    twice where NARROW_SHARE of the windows or more are telephone-band (TELEPHONE_BAND)."""
    per_region = [window_spans(region) for region in regions]
    embeddings = np.zeros((sum(map(len, per_region)), EMBEDDING_SIZE), dtype=np.float32)
    narrow = np.zeros(len(embeddings), dtype=bool)
    done = 0
    with open_stream() as stream:
        for powers in partial_powers(stream, regions, per_region):
            embeddings[done : done + len(powers)] = encoder.embed(to_mels(powers, encoder.mel_filters))
            narrow[done : done + len(powers)] = band_edge_ratio(powers, NARROW_EDGE, NARROW_ABOVE) < NARROW_RATIO
            done += len(powers)
    band_mixed = bool(len(narrow)) and narrow.mean() >= NARROW_SHARE
    if band_mixed:
        embeddings = mixed_embeddings(embeddings, band_embeddings(open_stream, regions, per_region, encoder))
    spans = np.array([span for spans in per_region for span in spans], dtype=np.int64).reshape(-1, 2)
    regions_of = np.repeat(np.arange(len(regions)), [len(spans) for spans in per_region]).astype(np.int64)
    return SpeechWindows(regions, spans, regions_of, embeddings, duration, band_mixed)


def mixed_embeddings(full_band: np.ndarray, telephone_band: np.ndarray) -> np.ndarray:
    """The unit mean of each window's full-band and TELEPHONE_BAND embeddings [n, 256]: what a file holding
    telephone-band speech embeds, its windows and the known speakers' references alike."""
    mixed = full_band + telephone_band
    return mixed / np.maximum(np.linalg.norm(mixed, axis=-1, keepdims=True), 1e-12)


def band_embeddings(open_stream: Callable[[], AudioStream], regions: tuple[SpeechRegion, ...],
                    per_region: list[list[tuple[int, int]]], encoder: SpeakerEncoder) -> np.ndarray:
    """The windows' embeddings [n, 256] of their TELEPHONE_BAND alone."""
    with open_stream() as stream:
        out = [telephone_band_embeddings(powers, encoder) for powers in partial_powers(stream, regions, per_region)]
    return np.concatenate(out) if out else np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)


def telephone_band_embeddings(powers: np.ndarray, encoder: SpeakerEncoder) -> np.ndarray:
    """The embeddings [n, 256] of partials' power spectra [n, 160, 201] seen through TELEPHONE_BAND alone."""
    return encoder.embed(to_mels(powers, band_limited_filters(encoder.mel_filters, *TELEPHONE_BAND)))


def partial_powers(stream: AudioStream, regions: tuple[SpeechRegion, ...],
                   per_region: list[list[tuple[int, int]]]) -> Iterator[np.ndarray]:
    """The windows' partials' power spectra [<= BATCH, 160, 201], in order, each region's audio read once."""
    pending: list[np.ndarray] = []
    for region, spans in zip(regions, per_region, strict=True):
        samples = stream.read(region.start, region.n_samples)
        for start, end in spans:
            pending.append(partial_power(samples[start - region.start : end - region.start]))
            if len(pending) == BATCH:
                yield np.stack(pending)
                pending = []
    if pending:
        yield np.stack(pending)
