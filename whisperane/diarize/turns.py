"""Speaker turns from labelled windows: each 10 ms frame of a speech region goes to the speaker whose centroid the
windows covering it are closest to on average, runs of one speaker become turns, cut to the speech
(``speech.speech_spans``) where it is given, a speaker's turns closer than FILL_GAP are joined, and labels are
numbered SPEAKER_00, SPEAKER_01, ... in order of first speech."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..audio import SAMPLE_RATE
from ..result import SpeakerTurn
from ..vad.regions import SpeechRegion
from .clustering import centroids_of
from .speech import overlaps
from .windows import SpeechWindows

FRAME_SAMPLES = 160  # 10 ms
# A speaker's pause shorter than this stays inside the turn (a breath, a gap between words the VAD ended speech at);
# a longer one ends it, so that a turn ends where the speech does and covers no pause as speech.
FILL_GAP = 0.3


def label(index: int) -> str:
    return f"SPEAKER_{index:02d}"


def speaker_turns(windows: SpeechWindows, clusters: np.ndarray, names: Mapping[int, str] | None = None,
                  speech: Sequence[SpeechRegion] | None = None) -> tuple[SpeakerTurn, ...]:
    """Turns (seconds) from each window's cluster, inside ``speech`` (sorted, disjoint; None: the windows'
    regions whole), labelled by ``names`` (cluster -> a known speaker's name) and the other clusters SPEAKER_00,
    SPEAKER_01, ... in order of first speech."""
    if len(windows) == 0:
        return ()
    centroids = centroids_of(windows.embeddings.astype(np.float64), clusters)
    similarity = windows.embeddings @ centroids.T  # [windows, speakers]
    raw: list[tuple[int, int, int]] = []  # (start sample, end sample, cluster)
    for index, region in enumerate(windows.regions):
        inside = np.flatnonzero(windows.regions_of == index)
        if len(inside):
            raw += region_runs(region.start, region.end, windows.spans[inside], similarity[inside])
    if speech is not None:
        raw = inside_speech(raw, speech)
    return numbered(joined(raw), names or {})


def inside_speech(raw: list[tuple[int, int, int]], speech: Sequence[SpeechRegion]) -> list[tuple[int, int, int]]:
    """The runs cut to the speech: what of each lies inside ``speech``, in time order."""
    parts = overlaps([(start, end) for start, end, _ in raw], [(r.start, r.end) for r in speech])
    # each part lies inside one run: the last to start at or before it
    owner = np.searchsorted([start for start, _, _ in raw], [a for a, _ in parts], side="right") - 1
    return [(a, b, raw[k][2]) for (a, b), k in zip(parts, owner.tolist(), strict=True)]


def region_runs(start: int, end: int, spans: np.ndarray, similarity: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of one cluster over a region's frames, each frame scored by the mean similarity of the windows covering
    it (the nearest window's where none does)."""
    n_frames = max(1, -(-(end - start) // FRAME_SAMPLES))
    scores = np.zeros((n_frames, similarity.shape[1]))
    covered = np.zeros(n_frames)
    for (first, last), row in zip(spans, similarity, strict=True):
        a, b = (first - start) // FRAME_SAMPLES, -(-(last - start) // FRAME_SAMPLES)
        scores[a:b] += row
        covered[a:b] += 1
    mean = scores / np.maximum(covered, 1)[:, None]
    empty = np.flatnonzero(covered == 0)
    if len(empty):  # frames between windows, or at a region's edge: the nearest window's
        centres = (spans.mean(axis=1) - start) / FRAME_SAMPLES
        mean[empty] = similarity[np.abs(empty[:, None] + 0.5 - centres[None, :]).argmin(axis=1)]
    best = np.argmax(mean, axis=1)
    changes = np.flatnonzero(np.diff(best)) + 1
    bounds = [0, *changes.tolist(), n_frames]
    return [(start + a * FRAME_SAMPLES, min(end, start + b * FRAME_SAMPLES), int(best[a]))
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def joined(raw: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Consecutive runs of one cluster closer than FILL_GAP made one."""
    out: list[tuple[int, int, int]] = []
    for start, end, cluster in raw:
        if out and out[-1][2] == cluster and start - out[-1][1] < FILL_GAP * SAMPLE_RATE:
            out[-1] = (out[-1][0], end, cluster)
        else:
            out.append((start, end, cluster))
    return out


def numbered(raw: list[tuple[int, int, int]], names: Mapping[int, str]) -> tuple[SpeakerTurn, ...]:
    order: dict[int, str] = dict(names)
    for _, _, cluster in raw:
        if cluster not in order:
            order[cluster] = label(len(order) - len(names))
    return tuple(SpeakerTurn(order[c], round(s / SAMPLE_RATE, 3), round(e / SAMPLE_RATE, 3)) for s, e, c in raw)
