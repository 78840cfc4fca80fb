"""Speakers from window embeddings. The points clustered are chunks (``SpeechWindows.chunks``: a few seconds of
one region each, the normalized mean of its windows), merged by average linkage on cosine distance; every window
is then assigned to its nearest cluster centroid.

The count is where the dendrogram's merge distances jump most, by ratio: merges closer than LINK_ALWAYS are always
made, merges farther than LINK_NEVER never, and between the two the tree is cut where the next merge distance is the
most times the last one made (from JUMP_FLOOR at least where the next merge takes in a lone chunk). A telephone band
or noise brings all of a file's voices closer together, and a change of microphone moves one voice away from itself, so that no one
distance threshold holds across recordings; the largest jump moves with them. ``CountEstimate.margin`` says how far
the count is from turning into another.
At most MAX_CLUSTERED chunks are clustered (evenly spaced over the audio), so memory stays flat in the audio's
length; the rest follow the centroids. (Spectral clustering, which finds its own count from an eigengap, needs more
points per speaker than a speaker with a few seconds has.)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionsError

LINK_ALWAYS = 0.30  # cosine distance (average linkage) under which two clusters are always one speaker
LINK_NEVER = 0.45  # and at or over which they are never merged
# A lone chunk (a few seconds, often at a turn's edge where two voices meet) is the noisiest point clustered: it may
# join its voice just over LINK_ALWAYS after merges of that voice's own spread (0.15-0.25), and that ratio would
# rival the jump between two speakers, a count a few hundredths of kernel rounding turn over. A count that leaves a
# lone chunk a speaker of its own has its jump measured from JUMP_FLOOR at least (merges of whole clusters keep their
# ratio: a channel that brings two voices together brings their spread down with them).
JUMP_FLOOR = 0.25
# Fewer points than this (chunks: under 15-20 s of speech) hold too few merges for their largest jump to mean a
# speaker: they are merged up to LINK_NEVER.
MIN_JUMP_POINTS = 6
MAX_COUNT = 12  # the largest count estimated when no max_speakers is given
MAX_CLUSTERED = 600  # chunks clustered directly: a 600 x 600 distance matrix, 3 MB


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
        """(least, most) speakers ``n_points`` clustered points may be split into (at least 1 point)."""
        if self.num_speakers is not None:
            return (min(self.num_speakers, n_points),) * 2
        high = min(self.max_speakers or MAX_COUNT, n_points)
        return min(self.min_speakers or 1, high), high


@dataclass(frozen=True)
class CountEstimate:
    """The count of one set of points: ``count``, and ``jumps``: for each count k considered, the ratio of the
    merge distance that would leave k - 1 clusters to the one that left k (LINK_NEVER and LINK_ALWAYS standing in
    for the merges before the first and after the last; in the band they allow, the latter JUMP_FLOOR at least
    where the former takes in a lone chunk)."""

    count: int
    jumps: dict[int, float]

    @property
    def margin(self) -> float:
        """The chosen count's jump over the largest other one (inf when no other count was considered)."""
        others = [v for k, v in self.jumps.items() if k != self.count]
        return self.jumps[self.count] / max(others) if others else np.inf


def cluster_windows(embeddings: np.ndarray, chunks: np.ndarray, count: SpeakerCount | None = None) -> np.ndarray:
    """A speaker index for each window (0..k-1, in no particular order); an empty array for no windows. ``chunks``
    (``SpeechWindows.chunks``): the chunk of each window, -1 for a window only assigned, not clustered (every window
    is its own chunk when none has one)."""
    if len(embeddings) == 0:
        return np.zeros(0, dtype=np.int64)
    unit = normalized(np.asarray(embeddings, dtype=np.float64))
    points = chunk_points(unit, chunks if np.any(chunks >= 0) else np.arange(len(unit)))
    merges = average_linkage(points)
    labels = cut(len(points), merges, estimate_count(merges, len(points), count or SpeakerCount()).count)
    assigned = np.argmax(unit @ centroids_of(points, labels).T, axis=1)
    return np.unique(assigned, return_inverse=True)[1]


def chunk_points(unit: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """The normalized mean of each chunk's windows, at most MAX_CLUSTERED chunks evenly spaced [m, dim]."""
    ids = np.unique(chunks[chunks >= 0])
    ids = ids[np.unique(np.linspace(0, len(ids) - 1, min(len(ids), MAX_CLUSTERED)).round().astype(int))]
    return normalized(np.stack([unit[chunks == k].mean(axis=0) for k in ids]))


def average_linkage(points: np.ndarray) -> list[tuple[int, int, float]]:
    """The merges (kept cluster, absorbed cluster, cosine distance) of average-linkage clustering down to one
    cluster, in order (distances never decrease); a cluster is named by its first point."""
    n = len(points)
    distance = 1.0 - points @ points.T
    np.fill_diagonal(distance, np.inf)
    sizes = np.ones(n)
    merges = []
    for _ in range(n - 1):
        i, j = divmod(int(np.argmin(distance)), n)
        i, j = min(i, j), max(i, j)
        merges.append((i, j, float(distance[i, j])))
        # the merged cluster's distance to every other: the size-weighted mean of its two parts' (average linkage)
        merged = (sizes[i] * distance[i] + sizes[j] * distance[j]) / (sizes[i] + sizes[j])
        distance[i], distance[:, i] = merged, merged
        distance[i, i] = np.inf
        distance[j], distance[:, j] = np.inf, np.inf
        sizes[i] += sizes[j]
    return merges


def estimate_count(merges: list[tuple[int, int, float]], n: int, count: SpeakerCount) -> CountEstimate:
    """The count of ``n`` points from their merges, within ``count``'s bounds: the largest jump among the counts
    LINK_ALWAYS and LINK_NEVER allow (among all counts in bounds when they allow none in bounds)."""
    low, high = count.bounds(n)
    # leaves[k]: the distance of the merge that left k clusters; the band's edges beyond the first and last merge
    leaves = {0: LINK_NEVER, n: LINK_ALWAYS} | {n - 1 - m: d for m, (_, _, d) in enumerate(merges)}
    lone = {n - 1 - m for m, alone in enumerate(takes_in_one(merges, n)) if alone}  # k - 1 where k leaves one alone
    jumps = {k: leaves[k - 1] / max(leaves[k], 1e-9) for k in range(low, high + 1)}
    allowed = {k: leaves[k - 1] / max(leaves[k], JUMP_FLOOR if k - 1 in lone else 1e-9) for k in jumps
               if leaves[k] < LINK_NEVER and leaves[k - 1] >= LINK_ALWAYS}
    if n < MIN_JUMP_POINTS and allowed:  # too few merges for a telling jump: the fewest clusters the band allows
        allowed = {min(allowed): allowed[min(allowed)]}
    considered = allowed or jumps
    return CountEstimate(max(considered, key=lambda k: (considered[k], -k)), considered)


def takes_in_one(merges: list[tuple[int, int, float]], n: int) -> list[bool]:
    """For each merge of ``n`` points, whether one of the two clusters it joins is a single point."""
    sizes = np.ones(n, dtype=np.int64)
    out = []
    for i, j, _ in merges:
        out.append(min(sizes[i], sizes[j]) == 1)
        sizes[i] += sizes[j]
    return out


def cut(n: int, merges: list[tuple[int, int, float]], k: int) -> np.ndarray:
    """Labels 0..k-1 of ``n`` points after the first n - k merges."""
    owner = np.arange(n)
    for i, j, _ in merges[: n - k]:
        owner[owner == j] = i
    return np.unique(owner, return_inverse=True)[1]


def centroids_of(points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The unit-length mean embedding of each cluster [k, dim]."""
    return normalized(np.stack([points[labels == k].mean(axis=0) for k in range(int(labels.max()) + 1)]))


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
