"""Speakers from window embeddings: spectral clustering with the normalized maximum eigengap (NME-SC, Park et al.
2019, "Auto-Tuning Spectral Clustering for Speaker Diarization Using Normalized Maximum Eigengap"). The cosine
affinity of the windows is pruned to each window's p nearest neighbours (binarized, symmetrized); p is the one that
minimizes p over the graph Laplacian's largest eigengap (normalized by its largest eigenvalue), and the speaker
count is where that eigengap lies: the count follows the structure of each file's own affinities, not one distance
threshold. The windows are then split by k-means (seeded, several starts) on the Laplacian's first eigenvectors, and
every window (the unreliable ones too) assigned to its nearest cluster centroid. At most MAX_CLUSTERED windows are
clustered (evenly spaced over the audio), so memory stays flat in the audio's length. numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionsError

MAX_CLUSTERED = 800  # windows clustered directly: an 800 x 800 affinity, 5 MB, and its eigenvalues
MAX_COUNT = 12  # the largest speaker count estimated when no max_speakers is given
# p, each window's neighbours kept in the pruned affinity, is searched up to this share of the windows (at least 2):
# a speaker's windows must fill most of their neighbours' places for their block to stand apart.
MAX_NEIGHBOUR_SHARE = 0.25
P_STEPS = 24  # values of p tried, evenly spaced from 2 to the largest (all of them when fewer)
CONNECTED = 1e-6  # a Laplacian's second eigenvalue under this share of its largest: the graph is in pieces
MIN_WINDOWS = 4  # fewer clustered windows than this hold no count to estimate: one speaker, unless told otherwise
KMEANS_STARTS = 10
KMEANS_SEED = 0


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

    def bounds(self, n_points: int) -> tuple[int, int]:
        """(least, most) speakers that ``n_points`` clustered windows may be split into."""
        if self.num_speakers is not None:
            return (min(self.num_speakers, n_points),) * 2
        high = min(self.max_speakers or MAX_COUNT, n_points)
        return min(self.min_speakers or 1, high), high


@dataclass(frozen=True)
class CountEstimate:
    """The spectral count of one set of windows: ``count``, the neighbours ``p`` its graph keeps, and the eigengaps
    ``gaps`` of its Laplacian (``gaps[k - 1]``: between the k-th and the (k+1)-th smallest eigenvalue)."""

    count: int
    p: int
    gaps: np.ndarray
    low: int = 1
    high: int = 1

    @property
    def margin(self) -> float:
        """The chosen count's eigengap over the largest other one in the allowed range (inf when none): how far
        the count is from turning into another."""
        others = np.delete(self.gaps[self.low - 1 : self.high], self.count - self.low)
        return float(self.gaps[self.count - 1] / others.max()) if len(others) and others.max() > 0 else np.inf


def cluster_windows(embeddings: np.ndarray, count: SpeakerCount | None = None,
                    reliable: np.ndarray | None = None) -> np.ndarray:
    """A cluster index for each window (0..k-1, in no particular order); an empty array for no windows.
    ``reliable`` (a mask): the windows clustered, the others only assigned to the nearest centroid (all windows
    when none is reliable)."""
    if len(embeddings) == 0:
        return np.zeros(0, dtype=np.int64)
    unit = normalized(np.asarray(embeddings, dtype=np.float64))
    points = unit[clustered_indices(len(unit), reliable)]
    labels = spectral_labels(points, estimate_count(points, count or SpeakerCount()))
    return nearest_centroid(unit, points, labels)


def clustered_indices(n: int, reliable: np.ndarray | None) -> np.ndarray:
    """The windows clustered: the reliable ones (all when none is), at most MAX_CLUSTERED evenly spaced."""
    candidates = np.flatnonzero(reliable) if reliable is not None and np.any(reliable) else np.arange(n)
    keep = np.linspace(0, len(candidates) - 1, min(len(candidates), MAX_CLUSTERED)).round().astype(int)
    return candidates[np.unique(keep)]


def estimate_count(points: np.ndarray, count: SpeakerCount) -> CountEstimate:
    """NME-SC's p and speaker count for unit ``points`` within ``count``'s bounds."""
    n = len(points)
    low, high = count.bounds(n)
    if n < MIN_WINDOWS or high == 1:
        return CountEstimate(max(low, 1) if n >= MIN_WINDOWS else min(low, n), 1, np.zeros(1), low, high)
    similarity = points @ points.T
    largest = max(2, int(MAX_NEIGHBOUR_SHARE * n))
    best: tuple[float, int, np.ndarray] | None = None
    for p in np.unique(np.linspace(2, largest, P_STEPS).round().astype(int)).tolist() + list(range(largest + 1, n)):
        eigenvalues = np.linalg.eigvalsh(laplacian(pruned_affinity(similarity, p)))
        if eigenvalues[1] < CONNECTED * eigenvalues[-1]:  # a graph in pieces: its zero eigenvalues are no count
            continue
        if best is not None and p > largest:
            break
        gaps = np.diff(eigenvalues)[:high]
        ratio = p / max(float(gaps[low - 1 :].max() / max(eigenvalues[-1], 1e-10)), 1e-10)
        if best is None or ratio < best[0]:
            best = (ratio, p, gaps)
    assert best is not None
    _, p, gaps = best
    return CountEstimate(low + int(np.argmax(gaps[low - 1 :])), p, gaps, low, high)


def pruned_affinity(similarity: np.ndarray, p: int) -> np.ndarray:
    """Each row's ``p`` most similar other windows set to 1, the rest 0, then symmetrized: (B + B^T) / 2."""
    n = len(similarity)
    ranked = np.argsort(-(similarity - 2 * np.eye(n)), axis=1, kind="stable")[:, :p]
    binary = np.zeros_like(similarity)
    np.put_along_axis(binary, ranked, 1.0, axis=1)
    return (binary + binary.T) / 2


def laplacian(affinity: np.ndarray) -> np.ndarray:
    """The unnormalized graph Laplacian D - A."""
    return np.diag(affinity.sum(axis=1)) - affinity


def spectral_labels(points: np.ndarray, estimate: CountEstimate) -> np.ndarray:
    """Labels 0..k-1 of ``points``: k-means on the first ``estimate.count`` eigenvectors of the pruned graph's
    Laplacian."""
    n, k = len(points), estimate.count
    if k <= 1 or n <= k:
        return np.arange(n) if n <= k and k > 1 else np.zeros(n, dtype=np.int64)
    _, vectors = np.linalg.eigh(laplacian(pruned_affinity(points @ points.T, estimate.p)))
    return kmeans(vectors[:, :k], k)


def kmeans(x: np.ndarray, k: int) -> np.ndarray:
    """Lloyd's k-means from KMEANS_STARTS k-means++ starts (seeded: the same labels on every run), the lowest
    inertia kept; labels renumbered 0..k-1 in order of first appearance."""
    rng = np.random.default_rng(KMEANS_SEED)
    best, best_inertia = None, np.inf
    for _ in range(KMEANS_STARTS):
        centres = x[[int(rng.integers(len(x)))]]
        while len(centres) < k:  # k-means++: the next centre drawn in proportion to its squared distance
            distance = ((x[:, None, :] - centres[None]) ** 2).sum(-1).min(axis=1)
            total = distance.sum()
            pick = int(rng.choice(len(x), p=distance / total)) if total > 0 else int(rng.integers(len(x)))
            centres = np.vstack([centres, x[pick]])
        for _ in range(100):
            labels = ((x[:, None, :] - centres[None]) ** 2).sum(-1).argmin(axis=1)
            moved = np.stack([x[labels == j].mean(axis=0) if np.any(labels == j) else centres[j] for j in range(k)])
            if np.allclose(moved, centres):
                break
            centres = moved
        inertia = float(((x - centres[labels]) ** 2).sum())
        if inertia < best_inertia - 1e-12:
            best, best_inertia = labels, inertia
    assert best is not None
    return np.unique(best, return_inverse=True)[1]


def nearest_centroid(unit: np.ndarray, points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Every window's nearest cluster centroid (the clustered windows keep theirs where it is nearest)."""
    return np.argmax(unit @ centroids_of(points, labels).T, axis=1)


def centroids_of(points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The unit-length mean embedding of each cluster [k, dim]."""
    return normalized(np.stack([points[labels == k].mean(axis=0) for k in range(int(labels.max()) + 1)]))


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
