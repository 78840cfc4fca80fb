"""openai-whisper's DTW with its exact choice rule, vectorised in numpy: the tests' reference for the
run-time DTW (``whisperane.timing.dtw``, dtw-python's ``symmetric1``).

openai's ``dtw_cpu`` + ``backtrace`` (and CTranslate2's ``negative_dtw``, which faster-whisper uses):
moves (1,1), (1,0), (0,1), each cell's cost added once, cumulative costs kept in float32, and this
choice rule: the diagonal if it is strictly the smallest, else the vertical (next token) if strictly the
smallest, else the horizontal (next frame). That rule is not a pure tie-break: when the diagonal and the
vertical tie below the horizontal it takes the horizontal. dtw-python's ``symmetric1`` takes the first
minimum in the order diagonal, horizontal, vertical, and accumulates in float64, so the two differ only
where cumulative costs tie exactly (or tie in float32 but not in float64).

tests/test_timing.py checks this against a loop-for-loop port of openai's code.
"""

from __future__ import annotations

import numpy as np


def openai_dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's DTW path over a [N, M] local-cost matrix: (text_indices, time_indices)."""
    x = np.ascontiguousarray(cost, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"dtw needs a non-empty 2-D cost matrix, got shape {x.shape}")
    acc = _accumulate_min_rule(x)
    if _has_openai_quirk(acc):
        acc = _accumulate_openai_rule(x)
    return _backtrace(acc)


# The cumulative cost is evaluated one anti-diagonal at a time (every cell of a diagonal depends only
# on the two previous ones), which vectorises the recurrence. Skewed layout: acc[d, i] is the cost of
# cell (i, d - i) of the padded (N+1, M+1) matrix whose row 0 / column 0 are the inf boundary.


def _diagonal_cells(d: int, n: int, m: int) -> tuple[int, int, int]:
    lo = max(1, d - m)
    hi = min(n, d - 1)
    # flat index of x[lo - 1, d - lo - 1]; cells of one anti-diagonal are m - 1 apart in x
    return lo, hi, (lo - 1) * (m - 1) + d - 2


def _accumulate_min_rule(x: np.ndarray) -> np.ndarray:
    """Cumulative cost with plain min(c0, c1, c2): three ufunc calls a diagonal."""
    n, m = x.shape
    flat = x.reshape(-1)
    step = max(m - 1, 1)
    acc = np.full((n + m + 1, n + 1), np.inf, dtype=np.float32)
    acc[0, 0] = 0.0
    best = np.empty(n + 1, dtype=np.float32)
    for d in range(2, n + m + 1):
        lo, hi, first = _diagonal_cells(d, n, m)
        k = hi - lo + 1
        c = best[:k]
        np.minimum(acc[d - 1, lo - 1 : hi], acc[d - 1, lo : hi + 1], out=c)
        np.minimum(acc[d - 2, lo - 1 : hi], c, out=c)
        # float64 sum rounded to float32, as openai's numba kernel stores it
        np.add(
            flat[first : first + (k - 1) * step + 1 : step], c, out=acc[d, lo : hi + 1], casting="same_kind"
        )
    return acc


def _has_openai_quirk(acc: np.ndarray) -> bool:
    """Whether some cell has c0 == c1 < c2, the only case where openai's rule does not take the minimum.
    Where no cell does, both rules give the same cumulative costs (by induction over the diagonals)."""
    c0, c1, c2 = acc[:-2, :-1], acc[1:-1, :-1], acc[1:-1, 1:]
    valid = np.isfinite(acc[2:, 1:])
    return bool(((c0 == c1) & (c0 < c2) & valid).any())


def _accumulate_openai_rule(x: np.ndarray) -> np.ndarray:
    """Cumulative cost with openai's choice rule, for the rare matrices with exact ties (~2x slower)."""
    n, m = x.shape
    flat = x.reshape(-1)
    step = max(m - 1, 1)
    acc = np.full((n + m + 1, n + 1), np.inf, dtype=np.float32)
    acc[0, 0] = 0.0
    take_diagonal = np.empty(n + 1, dtype=bool)
    take_vertical = np.empty(n + 1, dtype=bool)
    smaller = np.empty(n + 1, dtype=np.float32)
    chosen = np.empty(n + 1, dtype=np.float32)
    for d in range(2, n + m + 1):
        lo, hi, first = _diagonal_cells(d, n, m)
        k = hi - lo + 1
        c0 = acc[d - 2, lo - 1 : hi]
        c1 = acc[d - 1, lo - 1 : hi]
        c2 = acc[d - 1, lo : hi + 1]
        t0, t1, other, c = take_diagonal[:k], take_vertical[:k], smaller[:k], chosen[:k]
        np.less(c0, np.minimum(c1, c2, out=other), out=t0)
        np.less(c1, np.minimum(c0, c2, out=other), out=t1)
        np.copyto(c, c2)
        np.copyto(c, c1, where=t1)
        np.copyto(c, c0, where=t0)
        np.add(
            flat[first : first + (k - 1) * step + 1 : step], c, out=acc[d, lo : hi + 1], casting="same_kind"
        )
    return acc


def _backtrace(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walk back from (N, M), re-deciding each step with openai's rule from the cumulative costs."""
    n = acc.shape[1] - 1
    m = acc.shape[0] - 1 - n
    i, j = n, m
    text_path: list[int] = []
    time_path: list[int] = []
    while i > 0 or j > 0:
        text_path.append(i - 1)
        time_path.append(j - 1)
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:
            d = i + j
            c0, c1, c2 = acc[d - 2, i - 1], acc[d - 1, i - 1], acc[d - 1, i]
            if c0 < c1 and c0 < c2:
                i -= 1
                j -= 1
            elif c1 < c0 and c1 < c2:
                i -= 1
            else:
                j -= 1
    return np.array(text_path[::-1], dtype=np.int64), np.array(time_path[::-1], dtype=np.int64)
