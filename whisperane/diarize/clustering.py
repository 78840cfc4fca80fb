"""Speakers from window embeddings: average-linkage agglomerative clustering on cosine distance, stopped at a
distance threshold (the speaker count estimated) or at a given count, clusters too small to be a speaker merged
into their nearest, and every window then assigned to its nearest centroid. At most MAX_CLUSTERED windows are
clustered (evenly spaced over the audio), so memory stays flat in the audio's length; the rest follow the
centroids. The small-cluster rule: benchmarks/results/2026-12-06-session34-diarize.md; the threshold, the middle of
the range where every count is right over the transcript's speech: benchmarks/results/2026-12-06-session35-diarize-cost.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionsError

DISTANCE_THRESHOLD = 0.45  # cosine distance between clusters' average linkage at which merging stops
SMALL_CLUSTER = 0.05  # a cluster of fewer windows than this share (and at least 2) is not a speaker of its own
MAX_CLUSTERED = 800  # windows clustered directly: an 800 x 800 distance matrix, 5 MB


@dataclass(frozen=True)
class SpeakerCount:
    """``num_speakers``, or bounds on the estimated count (pyannote's and WhisperX's names)."""

    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_speakers", "min_speakers", "max_speakers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise OptionsError(f"{name} must be a positive integer, not {value!r}")
        low, high = self.min_speakers, self.max_speakers
        if low is not None and high is not None and low > high:
            raise OptionsError(f"min_speakers ({low}) is above max_speakers ({high})")
        if self.num_speakers is not None and (low is not None or high is not None):
            raise OptionsError("give num_speakers or min_speakers/max_speakers, not both")


def cluster_windows(embeddings: np.ndarray, count: SpeakerCount | None = None,
                    reliable: np.ndarray | None = None) -> np.ndarray:
    """A cluster index for each window (0..k-1, in no particular order); an empty array for no windows.
    ``reliable`` (a mask): the windows clustered, the others only assigned to the nearest centroid (all windows
    when none is reliable)."""
    count = count or SpeakerCount()
    n = len(embeddings)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    unit = normalized(embeddings)
    candidates = np.flatnonzero(reliable) if reliable is not None and np.any(reliable) else np.arange(n)
    chosen = candidates[np.unique(np.linspace(0, len(candidates) - 1, min(len(candidates), MAX_CLUSTERED))
                                  .round().astype(int))]
    points = unit[chosen].astype(np.float64)
    if count.num_speakers is not None:
        labels = agglomerate(points, stop_at=min(count.num_speakers, len(points)))
    else:
        labels = merge_small(points, agglomerate(points, threshold=DISTANCE_THRESHOLD))
        found = len(np.unique(labels))
        low, high = count.min_speakers or 1, count.max_speakers or found
        if not low <= found <= high:
            labels = agglomerate(points, stop_at=min(max(found, low), high, len(points)))
    return nearest_centroid(unit, points, labels)


def agglomerate(points: np.ndarray, threshold: float = np.inf, stop_at: int = 1) -> np.ndarray:
    """Average linkage on cosine distance: the closest two clusters merged until ``stop_at`` remain or the closest
    are ``threshold`` apart. Returns labels 0..k-1."""
    n = len(points)
    distance = 1.0 - points @ points.T
    np.fill_diagonal(distance, np.inf)
    sizes = np.ones(n)
    members = np.arange(n)
    alive = n
    while alive > stop_at:
        flat = int(np.argmin(distance))
        i, j = divmod(flat, n)
        if distance[i, j] >= threshold:
            break
        # the merged cluster's distance to every other: the size-weighted mean of its two parts' (average linkage)
        merged = (sizes[i] * distance[i] + sizes[j] * distance[j]) / (sizes[i] + sizes[j])
        distance[i], distance[:, i] = merged, merged
        distance[i, i] = np.inf
        distance[j], distance[:, j] = np.inf, np.inf
        sizes[i] += sizes[j]
        members[members == j] = i
        alive -= 1
    return np.unique(members, return_inverse=True)[1]


def merge_small(points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Clusters smaller than SMALL_CLUSTER of the windows (at least 2) moved to their nearest large cluster."""
    ids, sizes = np.unique(labels, return_counts=True)
    large = ids[sizes >= max(2, SMALL_CLUSTER * len(labels))]
    if len(large) in (0, len(ids)):
        return labels
    small = ~np.isin(labels, large)
    centroids = normalized(np.stack([points[labels == k].mean(axis=0) for k in large]))
    labels = labels.copy()
    labels[small] = large[np.argmax(points[small] @ centroids.T, axis=1)]
    return np.unique(labels, return_inverse=True)[1]


def nearest_centroid(unit: np.ndarray, points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Every window's nearest cluster centroid (the clustered windows keep theirs where it is nearest)."""
    return np.argmax(unit @ centroids_of(points, labels).T, axis=1)


def centroids_of(points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The unit-length mean embedding of each cluster [k, dim]."""
    return normalized(np.stack([points[labels == k].mean(axis=0) for k in range(int(labels.max()) + 1)]))


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
