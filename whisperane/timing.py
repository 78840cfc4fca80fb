"""Word-level timestamps from the alignment heads' cross-attention (openai-whisper's timing.py in numpy,
the DTW dtw-python's ``symmetric1``, written in numpy).

The TextDecoder returns, for every position it runs, the cross-attention of the alignment heads over
the encoder frames (``alignment_heads_weights``, already softmaxed). A teacher-forced pass over
``[*sot_sequence, no_timestamps, *text_tokens, eot]`` gives them for every position at once; the rows
that matter are the positions that *predict* each text token and the final eot: position ``r`` reads
token ``r`` and predicts token ``r + 1``, so the row for ``text_tokens[0]`` is the ``no_timestamps``
position (the last prompt position), not the position of ``text_tokens[0]`` itself.

From those rows: keep the frames that hold audio, standardize each head over the tokens, median
filter along the frames, average the heads, run DTW on the negated matrix; the frame where the DTW
path first reaches a token's row is the token's start (0.02 s per encoder frame). Tokens are then
grouped into words and punctuation is merged into its neighbours; ``longform.words.add_word_timestamps``
places the words in a window's segments.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .audio import INPUT_STRIDE, TOKENS_PER_SECOND
from .options import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS

# Words that hallucination_silence_threshold ignores when it scores a segment (openai's `punctuation`).
PUNCTUATION = PREPEND_PUNCTUATIONS + APPEND_PUNCTUATIONS
SENTENCE_END_MARKS = ".。!！?？"


def is_punctuation_only(word: str) -> bool:
    """Whether a decoded word is punctuation alone (or nothing): what the decoder writes into noise, and the lone "."
    it writes at the end of a live buffer over speech it cannot read yet."""
    return not word.strip().strip(PUNCTUATION)


class WordTokenizer(Protocol):
    """The part of the tokenizer this module needs (openai-whisper's Tokenizer API)."""

    @property
    def eot(self) -> int: ...

    def split_to_word_tokens(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]: ...


@dataclass(frozen=True)
class WordTiming:
    word: str
    tokens: tuple[int, ...]
    start: float  # seconds from the start of the window
    end: float
    probability: float


def median_filter(x: np.ndarray, filter_width: int) -> np.ndarray:
    """Median filter of odd width along the last axis, reflect-padded (the edge is not repeated).

    As openai-whisper: an input no longer than half the width is returned unchanged.
    """
    if filter_width <= 0 or filter_width % 2 != 1:
        raise ValueError(f"filter_width must be a positive odd number, got {filter_width}")
    x = np.asarray(x)
    pad = filter_width // 2
    if filter_width == 1 or x.shape[-1] <= pad:
        return x
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    # An odd length gets one more column, so the last pair's second window exists (its output is dropped).
    padded = np.pad(rows, [(0, 0), (pad, pad + n % 2)], mode="reflect")
    pairs = (n + 1) // 2
    out = np.empty((rows.shape[0], 2 * pairs), dtype=rows.dtype)
    network = _middle_pair_network(filter_width - 1)
    # Windows 2q and 2q + 1 share filter_width - 1 values (the core); with the core's two middle values lo <= hi,
    # each window's median is its own extra value clamped to [lo, hi]. The core's middle pair comes from a sorting
    # network (min/max over whole arrays, so the result is exactly one of the inputs) run once for two outputs:
    # half the array operations of a network per window. Rows go through in blocks whose lanes stay in the core's
    # cache; the network works in place on copies of the core's lanes and one spare array.
    spare = np.empty((_MEDIAN_ROWS, pairs), dtype=rows.dtype)
    for first in range(0, rows.shape[0], _MEDIAN_ROWS):
        block = padded[first : first + _MEDIAN_ROWS]
        even, odd = block[:, 0::2].copy(), block[:, 1::2].copy()  # padded column 2q + k is lane k of pair q
        lanes = [(odd if k % 2 else even)[:, k // 2 : k // 2 + pairs] for k in range(filter_width + 1)]
        core = [lane.copy() for lane in lanes[1:filter_width]]
        core, spare = _middle_pair(network, core, spare[: len(block)])
        lo, hi = core[pad - 1], core[pad]
        block_out = out[first : first + _MEDIAN_ROWS]
        np.maximum(lo, np.minimum(hi, lanes[0]), out=block_out[:, 0::2])
        np.maximum(lo, np.minimum(hi, lanes[filter_width]), out=block_out[:, 1::2])
    return out[:, :n].reshape(x.shape)


_MEDIAN_ROWS = 16  # 16 x 750 float32 a lane, cache-sized


def _middle_pair(network: list[tuple[int, bool, bool]], core: list[np.ndarray], spare: np.ndarray
                 ) -> tuple[list[np.ndarray], np.ndarray]:
    """``network``'s compare-exchanges on the lanes ``core`` in place (each lane its own array); returns the lanes
    and the array left spare (a full exchange writes its min into the spare, which then takes the lane's place)."""
    for i, low, high in network:
        a, b = core[i], core[i + 1]
        if low and high:
            np.minimum(a, b, out=spare)
            np.maximum(a, b, out=b)
            core[i], spare = spare, a
        elif low:
            np.minimum(a, b, out=a)
        else:
            np.maximum(a, b, out=b)
    return core, spare


@functools.lru_cache(maxsize=8)
def _middle_pair_network(lanes: int) -> list[tuple[int, bool, bool]]:
    """Odd-even transposition sort of an even number of lanes, pruned to what its two middle lanes depend on:
    the compare-exchanges (i, i + 1) in order, each with whether its min (lane i) and max (lane i + 1) are used
    (6 lanes: 26 of the full network's 30 array operations)."""
    network = [i for round_ in range(lanes) for i in range(round_ % 2, lanes - 1, 2)]
    needed, kept = {lanes // 2 - 1, lanes // 2}, []
    for i in reversed(network):
        low, high = i in needed, i + 1 in needed
        if low or high:
            kept.append((i, low, high))
            needed |= {i, i + 1}
    return kept[::-1]


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic time warping over a [N, M] local-cost matrix; returns the path (text_indices, time_indices).

    dtw-python's ``symmetric1`` step pattern (docs/DESIGN.md §1), reproduced exactly: moves (1,1), (0,1), (1,0),
    each cell's cost added once in float64, the path from (0, 0) to (N-1, M-1) through every row and every
    column; where candidates tie, the first in the order diagonal, horizontal, vertical. Rows are the query
    (tokens), columns the reference (frames), as openai-whisper's ``dtw(-matrix)``. openai's ``dtw_cpu`` and
    CTranslate2's ``negative_dtw`` (faster-whisper) find the same path except where cumulative costs tie
    exactly: openai takes the diagonal or the vertical only if strictly smallest, else the horizontal, and
    keeps float32 sums. On real alignment matrices this gives identical word times (tests/test_timing.py
    counts the clips where it does not; tests/dtw_reference.py holds openai's rule).

    Written here rather than imported: dtw-python imports scipy.spatial (a large part of a short file's run and
    of an install), and its cost-matrix kernel is the only part needed.
    """
    x = np.ascontiguousarray(cost, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"dtw needs a non-empty 2-D cost matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("dtw cost matrix holds NaN or inf")
    moves = _cumulative_cost_moves(x)
    return _backtrack(moves, *x.shape)


def _by_antidiagonal(x: np.ndarray) -> np.ndarray:
    """[N, M] -> [N + M - 1, N]: row k holds the cells (i, k - i) of the anti-diagonal k, inf off the matrix."""
    n, m = x.shape
    width = m + 2 * (n - 1)
    padded = np.full((n, width), np.inf)
    padded[:, n - 1 : n - 1 + m] = x
    # (i, k - i) is padded[i, k - i + n - 1]: flat offset n - 1 + k + i * (width - 1).
    step = padded.itemsize
    return as_strided(padded.reshape(-1)[n - 1 :], (n + m - 1, n), (step, (width - 1) * step)).copy()


def _cumulative_cost_moves(x: np.ndarray) -> np.ndarray:
    """The move that reached each cell at least cost, [N + M - 1, N] by anti-diagonal: 0 diagonal,
    1 horizontal (from (i, j - 1)), 2 vertical (from (i - 1, j)).

    Each candidate is summed as dtw-python sums it (previous total + this cell's cost), so ties and rounding
    fall as there. Only the totals need the anti-diagonal loop (every cell of one depends on the two before
    it), and rounding is monotonic, so the least of the three sums is exactly the least previous total plus
    the cell's cost: three array operations an anti-diagonal instead of seven. The moves are then found for all
    cells at once from the same sums.
    """
    n, m = x.shape
    local = _by_antidiagonal(x)
    total = np.full((n + m, n + 1), np.inf)  # total[k + 1, i + 1]: cell (i, k - i); row 0 and column 0 are off
    total[1, 1] = x[0, 0]
    # Each row's two views made once, not per use: the loop is ufunc calls on N values, where views cost.
    left, right, cells = list(total[:, :n]), list(total[:, 1:]), list(local)
    for k in range(1, n + m - 1):
        best = right[k + 1]
        np.minimum(left[k - 1], right[k], out=best)
        np.minimum(best, left[k], out=best)
        np.add(best, cells[k], out=best)
    here = local[1:]
    diag, horiz, vert = total[: n + m - 2, :n] + here, total[1:-1, 1:] + here, total[1:-1, :n] + here
    horizontal = np.zeros(local.shape, dtype=bool)
    vertical = np.zeros(local.shape, dtype=bool)
    np.less(horiz, diag, out=horizontal[1:])
    np.less(vert, np.minimum(diag, horiz), out=vertical[1:])
    return np.where(vertical, 2, horizontal.view(np.int8))


def _backtrack(moves: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = n - 1, m - 1
    path_i, path_j = [i], [j]
    while i > 0 or j > 0:
        move = moves.item(i + j, i)
        i -= move != 1
        j -= move != 2
        path_i.append(i)
        path_j.append(j)
    return np.array(path_i[::-1], dtype=np.int64), np.array(path_j[::-1], dtype=np.int64)


def alignment_matrix(
    weights: np.ndarray,
    num_text_rows: int,
    num_frames: int,
    *,
    first_row: int = 0,
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
) -> np.ndarray:
    """The [num_text_rows, frames] matrix that DTW aligns (larger = more attention); see find_alignment."""
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim not in (2, 3):
        raise ValueError(
            f"alignment weights must be [heads, tokens, frames] or [tokens, frames], got {w.shape}"
        )
    rows = w.shape[-2]
    if first_row < 0 or first_row + num_text_rows > rows:
        raise ValueError(
            f"alignment weights have {rows} rows; rows {first_row}..{first_row + num_text_rows - 1} "
            "(the positions predicting the text tokens and eot) are needed"
        )
    n_audio = num_frames // INPUT_STRIDE
    if n_audio < 1:
        raise ValueError(f"num_frames={num_frames} leaves no encoder frame to align to")
    w = w[..., :n_audio]
    # The decoder softmaxed over all encoder frames; openai softmaxes (logits * qk_scale) over the
    # audio frames only. softmax(s * z) restricted to a subset = p**s renormalised over that subset.
    if qk_scale != 1.0:
        w = w.astype(np.float64) ** qk_scale
    w = w / np.maximum(w.sum(axis=-1, keepdims=True), np.finfo(np.float32).tiny)
    w = w.astype(np.float32, copy=False)
    if w.ndim == 3:
        # Per-head standardisation over every row passed (openai and CTranslate2 use the whole
        # teacher-forced sequence, prompt rows included), then filter, then average the heads.
        w = standardised_rows(w)
    # The filter runs along frames, row by row: only the rows returned are filtered.
    w = median_filter(w[..., first_row : first_row + num_text_rows, :], medfilt_width)
    # 3-D: averaged over the heads after the filter; 2-D: already averaged (WhisperKit's decoder returns only the
    # mean), not standardised.
    return w.mean(axis=0) if w.ndim == 3 else w


def standardised_rows(w: np.ndarray) -> np.ndarray:
    """(w - mean) / std over axis -2 (std 0: / 1), bitwise ``(w - w.mean(-2)) / w.std(-2)`` as numpy computes
    them (its ``_mean`` and ``_var``: the sum, then a division in place by the count), with the mean and the
    deviations computed once instead of twice."""
    count = np.intp(w.shape[-2])
    mean = np.add.reduce(w, axis=-2, keepdims=True)
    np.true_divide(mean, count, out=mean, casting="unsafe")
    deviations = w - mean
    variance = np.add.reduce(np.square(deviations), axis=-2, keepdims=True)
    np.true_divide(variance, count, out=variance, casting="unsafe")
    std = np.sqrt(variance, out=variance)
    deviations /= np.where(std > 0, std, 1.0)
    return deviations


def find_alignment(
    weights: np.ndarray,
    text_tokens: Sequence[int],
    token_probs: Sequence[float] | np.ndarray,
    num_frames: int,
    tokenizer: WordTokenizer,
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
    *,
    first_row: int = 0,
) -> list[WordTiming]:
    """Word timings (seconds from the window start) of ``text_tokens`` from alignment-head attention.

    weights: [A, R, F] (per alignment head) or [R, F] (already averaged over heads, WhisperKit-style),
        softmaxed over the F encoder frames. Rows ``first_row .. first_row + len(text_tokens)`` must be
        the decoder positions that PREDICT ``text_tokens[0], ..., text_tokens[-1], eot`` in that order
        (position r reads token r and predicts token r + 1). Two ways to call it:
          - exactly those ``len(text_tokens) + 1`` rows, ``first_row=0``;
          - openai's/faster-whisper's numbers: every row of the teacher-forced pass over
            ``[*sot_sequence, no_timestamps, *text_tokens, eot]`` with ``first_row=len(sot_sequence)``
            (the no_timestamps position predicts text_tokens[0]). Every row passed enters the per-head
            standardisation, which is why this form reproduces openai's computation.
    token_probs: probability of each text token (``Decoder.score``), len(text_tokens).
    num_frames: mel frames of audio in the window (e.g. 3000 for a full 30 s window); encoder frames
        past num_frames // 2 are padding and are ignored.
    """
    if len(text_tokens) == 0:
        return []
    text_tokens = [int(t) for t in text_tokens]
    matrix = alignment_matrix(
        weights,
        len(text_tokens) + 1,
        num_frames,
        first_row=first_row,
        medfilt_width=medfilt_width,
        qk_scale=qk_scale,
    )
    text_indices, time_indices = dtw(-matrix)

    words, word_tokens = tokenizer.split_to_word_tokens(text_tokens + [tokenizer.eot])
    if len(word_tokens) <= 1:  # only eot
        return []
    word_boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))

    # The path visits every row; the frame where it first enters row k is where token k starts.
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    probs = np.asarray(token_probs, dtype=np.float64)
    word_probabilities = [
        float(np.mean(probs[i:j])) for i, j in zip(word_boundaries[:-1], word_boundaries[1:], strict=True)
    ]

    return [
        WordTiming(word, tuple(int(t) for t in tokens), float(start), float(end), probability)
        for word, tokens, start, end, probability in zip(
            words[:-1], word_tokens[:-1], start_times, end_times, word_probabilities, strict=True
        )  # the last "word" is eot
    ]


def merge_punctuations(
    alignment: list[WordTiming],
    prepended: str = PREPEND_PUNCTUATIONS,
    appended: str = APPEND_PUNCTUATIONS,
) -> list[WordTiming]:
    """Attach opening punctuation to the following word and closing punctuation to the previous one.

    openai's rules, returned as a new list of the same length: a merged-away entry stays as an empty
    word with no tokens (so positions line up with the input), and a merged word keeps its own start
    and end. Note openai's tests are substring tests (``word.strip() in prepended``).
    """
    words = [a.word for a in alignment]
    tokens = [list(a.tokens) for a in alignment]

    # prepended punctuation, right to left, so runs like ' "(' all reach the word they open
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        if words[i].startswith(" ") and words[i].strip() in prepended:
            words[j] = words[i] + words[j]
            tokens[j] = tokens[i] + tokens[j]
            words[i], tokens[i] = "", []
        else:
            j = i
        i -= 1

    # appended punctuation, left to right
    i, j = 0, 1
    while j < len(words):
        if not words[i].endswith(" ") and words[j] in appended:
            words[i] = words[i] + words[j]
            tokens[i] = tokens[i] + tokens[j]
            words[j], tokens[j] = "", []
        else:
            i = j
        j += 1

    return [
        dataclasses.replace(a, word=word, tokens=tuple(toks))
        for a, word, toks in zip(alignment, words, tokens, strict=True)
    ]


__all__ = [
    "APPEND_PUNCTUATIONS",
    "PREPEND_PUNCTUATIONS",
    "PUNCTUATION",
    "WordTiming",
    "alignment_matrix",
    "dtw",
    "find_alignment",
    "is_punctuation_only",
    "median_filter",
    "merge_punctuations",
]
