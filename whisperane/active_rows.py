"""The rows of a batched decoding still decoding (``ActiveRows``): a sampling loop's B rows, the samples of one
window or one window a row, of which each step runs only the unfinished ones."""

from __future__ import annotations

from collections.abc import Iterable

from .runtime.state import DecoderState


class ActiveRows:
    """The rows of a sampling loop still decoding, kept as the first rows of the batch: a finished row's place
    is taken by the last unfinished one (its cache copied, its window's cross K/V swapped in place), so each
    step runs only unfinished rows: a finished row left in the batch costs nearly a full row. ``restore`` puts the
    cross K/V back in their order. Where the executor keeps the caches (Core ML's MLState), finished rows stay, fed
    <|endoftext|>. Sampling noise is drawn for the rows openai's decoding would still sample (``noise_rows``): a
    row stopped at a loop leaves the batch but not them, so the other rows draw the noise they would have drawn."""

    def __init__(self, state: DecoderState, cross, n: int):
        self._state, self._cross = state, cross
        self.state, self.cross = state, cross
        self.rows = list(range(n))  # batch position -> row
        self._sampled = list(self.rows)  # the rows openai's decoding would still sample, in its batch order
        self._swaps: list[tuple[int, int]] = []
        self._compacts = n > 1 and state.first_rows(n) is not None

    def drop(self, finished: set[int], looped: Iterable[int]) -> None:
        """The ``finished`` rows out of the batch; those of them ``looped`` (stopped in a loop) still drawn for."""
        if not finished or not self._compacts:
            return
        self._sampled = _compacted(self._sampled, finished.difference(looped))[0]
        self.rows, moves = _compacted(self.rows, finished)
        for p, last in moves:
            self._state.set_row(p, self._state, last)
            if self._cross.batch > 1:
                self._cross.swap_rows(p, last)
                self._swaps.append((p, last))
        self.state = self._state.first_rows(len(self.rows))
        self.cross = self._cross.first_rows(len(self.rows))

    def noise_rows(self) -> tuple[int, list[int]] | None:
        """How many rows of noise to draw and which of them are the batch's rows'; None: one each, in order."""
        if self._sampled == self.rows:
            return None
        where = {k: i for i, k in enumerate(self._sampled)}
        return len(self._sampled), [where[k] for k in self.rows]

    def restore(self) -> None:
        for i, j in reversed(self._swaps):
            self._cross.swap_rows(i, j)
        self._swaps.clear()


def _compacted(rows: list[int], finished: set[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """``rows`` without the ``finished`` ones, from the end back, each one's place taken by the last row; and those
    moves (place, from)."""
    rows, moves = list(rows), []
    for p in reversed(range(len(rows))):
        if rows[p] in finished:
            last = len(rows) - 1
            if p != last:
                rows[p] = rows[last]
                moves.append((p, last))
            rows.pop()
    return rows, moves
