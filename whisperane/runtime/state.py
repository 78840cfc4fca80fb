"""The self-attention caches of one decoding call (``DecoderState``): B rows, each at its own position, with
their masks; ``GrowingState`` for graphs that take caches of any length; states pooled per batch size. The
state belongs to the call: one loaded model decodes from several threads."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..contract import KEY_CACHE, MASK_VALUE, PADDING_MASK, VALUE_CACHE
from ..errors import ModelError


@dataclass(frozen=True)
class CacheLayout:
    """How a decoder takes its caches: one [B, d*L, 1, S] array per cache (the contract) or one [B, d, 1, S]
    array per layer (``key_cache_0``...)."""

    n_layer: int
    dim: int
    length: int
    per_layer: bool

    def names(self, which: str) -> list[str]:
        return [f"{which}_{i}" for i in range(self.n_layer)] if self.per_layer else [which]

    def parts(self) -> int:
        return self.n_layer if self.per_layer else 1

    @property
    def channels(self) -> int:
        """The channels of one cache array: one layer's d, or every layer's."""
        return self.dim * (1 if self.per_layer else self.n_layer)


class DecoderState:
    """The self-attention caches of B rows and their masks; each row at its own position (``lengths``).

    The host writes each call's K/V at the row's position and opens the padding mask there. Arrays are
    allocated once per state; states are pooled per batch size (``StatePool``) and reused across windows.
    """

    def __init__(self, layout: CacheLayout, batch: int):
        shape = (batch, layout.channels, 1, layout.length)
        self.layout = layout
        self.batch = batch
        self.keys = [np.zeros(shape, dtype=np.float32) for _ in range(layout.parts())]
        self.values = [np.zeros(shape, dtype=np.float32) for _ in range(layout.parts())]
        self.padding = np.full((batch, layout.length), MASK_VALUE, dtype=np.float32)
        self.update = np.zeros((batch, layout.length), dtype=np.float32)
        self.lengths = np.zeros(batch, dtype=np.int32)
        self.rows = np.arange(batch)
        self._spare: tuple[list[np.ndarray], list[np.ndarray]] | None = None  # for select()
        self.cache_feeds = self._feeds()  # their contents change in place; ``select`` swaps the buffers
        self.native = None  # an executor's own state (Core ML MLState), when the decoder keeps the caches

    def _feeds(self) -> dict[str, np.ndarray]:
        return {**dict(zip(self.layout.names(KEY_CACHE), self.keys, strict=True)),
                **dict(zip(self.layout.names(VALUE_CACHE), self.values, strict=True))}

    def call_feeds(self, any_length: bool) -> dict[str, np.ndarray]:
        """The caches and the padding mask as a decoder call takes them. A graph whose cache length is free
        (``any_length``: TextDecoderSequence) gets none of the S positions while every row is empty: a
        window's prompt and its alignment pass then attend over their own tokens alone, not S masked positions
        besides (faster, the same outputs)."""
        if any_length and not self.lengths.any():
            return {**{n: c[..., :0] for n, c in self.cache_feeds.items()}, PADDING_MASK: self.padding[:, :0]}
        return {**self.cache_feeds, PADDING_MASK: self.padding}

    @property
    def length(self) -> int:
        """The longest row's length."""
        return max(self.lengths.tolist())  # a list's max: a numpy reduction of B values costs more, once a step

    def reset(self) -> None:
        self.padding.fill(MASK_VALUE)
        self.lengths.fill(0)

    def _reserve(self, n: int) -> None:
        """Room for ``n`` positions in every row: a fixed-length state has all S (``GrowingState`` grows)."""

    def check_room(self, t: int) -> None:
        if (length := self.length) + t > self.layout.length:
            raise ModelError(f"{t} tokens do not fit the decoder cache at position {length} "
                             f"({self.layout.length} positions)")

    def open(self, t: int) -> None:
        """Attend to the next ``t`` positions of every row."""
        self._open(self.lengths.tolist(), t)

    def _open(self, starts: list[int], t: int) -> None:
        if len(set(starts)) == 1:  # every row at one position (one window's samples, a lone row): one slice
            self.padding[:, starts[0] : starts[0] + t] = 0.0
            return
        for r, start in enumerate(starts):
            self.padding[r, start : start + t] = 0.0

    def write(self, key: np.ndarray, value: np.ndarray) -> None:
        """Append T positions to every row (key/value [B or 1, d*L, 1, T], layers concatenated). The positions come
        to Python once, as a list: between two one-token steps the host's work runs on caches the step has just
        evicted, where every numpy reduction costs tens of microseconds."""
        t = key.shape[3]
        self.check_room(t)
        starts = self.lengths.tolist()
        self._reserve(max(starts) + t)
        self._open(starts, t)
        d = self.layout.dim if self.layout.per_layer else key.shape[1]
        uniform = len(set(starts)) == 1
        for caches, update in ((self.keys, key), (self.values, value)):
            for i, cache in enumerate(caches):
                part = update[:, i * d : (i + 1) * d]
                if uniform:  # the common case: one slice for all rows
                    cache[:, :, :, starts[0] : starts[0] + t] = part
                else:
                    for r, start in enumerate(starts):
                        cache[r, :, :, start : start + t] = part[r if part.shape[0] > 1 else 0]
        self.lengths += t

    def copy_prefix_from(self, other: DecoderState) -> None:
        """Start every row from ``other``'s single row (a prefix decoded once, then sampled B ways)."""
        n = int(other.lengths[0])
        self._reserve(n)
        for mine, theirs in ((self.keys, other.keys), (self.values, other.values)):
            for cache, source in zip(mine, theirs, strict=True):
                cache[:, :, :, :n] = source[:1, :, :, :n]
        self.padding[:, :n] = 0.0
        self.padding[:, n:] = MASK_VALUE
        self.lengths[:] = n

    def set_row(self, row: int, other: DecoderState, other_row: int = 0) -> None:
        """Row ``row`` takes ``other``'s row (its cache, mask and position): rows prepared apart (each window's
        own prompt) decoded together."""
        n = int(other.lengths[other_row])
        self._reserve(n)
        for mine, theirs in ((self.keys, other.keys), (self.values, other.values)):
            for cache, source in zip(mine, theirs, strict=True):
                cache[row, :, :, :n] = source[other_row, :, :, :n]
        width = min(self.padding.shape[1], other.padding.shape[1])  # states may hold different capacities
        self.padding[row, :width] = other.padding[other_row, :width]
        self.padding[row, width:] = MASK_VALUE
        self.lengths[row] = n

    def first_rows(self, n: int) -> DecoderState | None:
        """The first ``n`` rows as a state of their own: views of this state's arrays (no copy), so what a
        call writes there is written here. None where an executor keeps the caches itself."""
        view = copy.copy(self)
        view.batch = n
        view.keys, view.values = [c[:n] for c in self.keys], [c[:n] for c in self.values]
        view.padding, view.update, view.lengths, view.rows = self.padding[:n], self.update[:n], self.lengths[:n], self.rows[:n]
        view._spare = None
        view.cache_feeds = view._feeds()
        return view

    def select(self, rows: np.ndarray) -> None:
        """Reorder or duplicate rows (beams): the caches up to the longest row are gathered into a second set
        of buffers, allocated once, which then take the first set's place (no allocation per step)."""
        rows = np.asarray(rows)
        if (rows == self.rows).all():
            return
        n = self.length
        if self._spare is None:
            # zeros, not empty: positions past a row's length still enter the one-hot blend (NaN * 0 is NaN)
            self._spare = ([np.zeros_like(c) for c in self.keys], [np.zeros_like(c) for c in self.values])
        for caches, spares in zip((self.keys, self.values), self._spare, strict=True):
            for i, (cache, spare) in enumerate(zip(caches, spares, strict=True)):
                np.take(cache[:, :, :, :n], rows, axis=0, out=spare[:, :, :, :n], mode="clip")
                caches[i], spares[i] = spare, cache
        self.cache_feeds = self._feeds()
        self.padding[:] = self.padding[rows]
        self.lengths[:] = self.lengths[rows]


CAPACITY_BLOCK = 64  # a GrowingState's caches hold its rows' positions rounded up to a multiple of this


def capacity_for(positions: int, length: int) -> int:
    """The positions a ``GrowingState`` holds for rows that have reached ``positions`` (at least 1), of ``length``."""
    return min(-(-positions // CAPACITY_BLOCK) * CAPACITY_BLOCK, length)


class _FlatCaches:
    """The buffers behind a ``GrowingState`` and its row views: each cache and the padding mask is one flat
    array of room for all S positions of ``batch`` rows, of which the first ``batch * channels * capacity``
    values are read as [batch, channels, 1, capacity]. ``version`` counts the changes of that layout."""

    def __init__(self, layout: CacheLayout, batch: int):
        self.batch = batch
        self.channels = layout.channels
        size = batch * self.channels * layout.length
        # zeros, not empty: positions past a row's length enter the attention (masked), and must be finite
        self.keys = [np.zeros(size, dtype=np.float32) for _ in range(layout.parts())]
        self.values = [np.zeros(size, dtype=np.float32) for _ in range(layout.parts())]
        self.padding = np.full(batch * layout.length, MASK_VALUE, dtype=np.float32)
        self.spare: tuple[list[np.ndarray], list[np.ndarray]] | None = None  # for GrowingState.select
        self.capacity = capacity_for(1, layout.length)
        self.version = 0

    def cache(self, flat: np.ndarray, rows: int) -> np.ndarray:
        c = self.capacity
        return flat[: rows * self.channels * c].reshape(rows, self.channels, 1, c)

    def mask(self, rows: int) -> np.ndarray:
        return self.padding[: rows * self.capacity].reshape(rows, self.capacity)

    def relayout(self, capacity: int, kept: int) -> None:
        """Every row at ``capacity`` positions: its first ``kept`` (at most what both layouts hold) as they were,
        the rest empty (zero K/V, masked). In place: numpy buffers an assignment whose source and target overlap."""
        for flat, rows, empty in [*((f, self.batch * self.channels, 0.0) for f in (*self.keys, *self.values)),
                                  (self.padding, self.batch, MASK_VALUE)]:
            old = flat[: rows * self.capacity].reshape(rows, self.capacity)
            new = flat[: rows * capacity].reshape(rows, capacity)
            new[:, :kept] = old[:, :kept]
            new[:, kept:] = empty
        self.capacity = capacity
        self.version += 1


class GrowingState(DecoderState):
    """A ``DecoderState`` whose caches hold only the positions its rows have reached, rounded up to
    CAPACITY_BLOCK, for graphs that take caches of any length (TextDecoderSequence): a one-token step
    then reads the filled part of each cache rather than all S positions (every output byte-identical).
    The caches are
    views of ``_FlatCaches``; a write past the capacity lays every row out again, larger, in place (a few
    times a window). ``first_rows`` views share the buffers and follow their layout."""

    def __init__(self, layout: CacheLayout, batch: int):
        self._bind(layout, batch, _FlatCaches(layout, batch), np.zeros(batch, dtype=np.int32), np.arange(batch))

    def _bind(self, layout: CacheLayout, batch: int, flat: _FlatCaches, lengths: np.ndarray, rows: np.ndarray) -> None:
        self.layout, self.batch, self._flat, self.lengths, self.rows = layout, batch, flat, lengths, rows
        self.update, self.native, self._version = None, None, -1

    def _sync(self) -> None:
        if self._version != self._flat.version:
            f = self._flat
            self._version = f.version  # first: ``_feeds`` reads the keys and values back through their properties
            self._keys = [f.cache(k, self.batch) for k in f.keys]
            self._values = [f.cache(v, self.batch) for v in f.values]
            self._padding = f.mask(self.batch)
            self._cache_feeds = self._feeds()

    @property
    def keys(self) -> list[np.ndarray]:
        self._sync()
        return self._keys

    @property
    def values(self) -> list[np.ndarray]:
        self._sync()
        return self._values

    @property
    def padding(self) -> np.ndarray:
        self._sync()
        return self._padding

    @property
    def cache_feeds(self) -> dict[str, np.ndarray]:
        self._sync()
        return self._cache_feeds

    def _reserve(self, n: int) -> None:
        if n > self._flat.capacity:
            self._flat.relayout(capacity_for(n, self.layout.length), kept=self._flat.capacity)

    def reset(self) -> None:
        self._flat.relayout(capacity_for(1, self.layout.length), kept=0)  # every row empty, all masked
        self.lengths.fill(0)

    def first_rows(self, n: int) -> DecoderState:
        view = GrowingState.__new__(GrowingState)
        view._bind(self.layout, n, self._flat, self.lengths[:n], self.rows[:n])
        return view

    def select(self, rows: np.ndarray) -> None:
        """Reorder or duplicate rows (beams) into a second set of buffers, which then take the first set's
        place; the rows of the whole batch move, so that views of fewer rows keep the rest."""
        rows = np.asarray(rows)
        if (rows == self.rows).all():
            return
        f, n = self._flat, self.length
        if f.spare is None:
            f.spare = ([np.zeros_like(k) for k in f.keys], [np.zeros_like(v) for v in f.values])
        every = np.concatenate([rows, np.arange(self.batch, f.batch)])
        for flats, spares in zip((f.keys, f.values), f.spare, strict=True):
            for i, (flat, spare) in enumerate(zip(flats, spares, strict=True)):
                np.take(f.cache(flat, f.batch)[..., :n], every, axis=0, out=f.cache(spare, f.batch)[..., :n], mode="clip")
                flats[i], spares[i] = spare, flat
        f.version += 1
        self.padding[:] = self.padding[rows]
        self.lengths[:] = self.lengths[rows]


class StatePool:
    """Decoder states for reuse, per batch size; a state is held by one call at a time."""

    def __init__(self, make: Callable[[int], DecoderState]):
        self._make = make
        self._free: dict[int, list[DecoderState]] = {}
        self._lock = threading.Lock()

    def acquire(self, batch: int) -> DecoderState:
        with self._lock:
            free = self._free.get(batch)
            state = free.pop() if free else None
        state = state or self._make(batch)
        state.reset()
        return state

    def release(self, state: DecoderState) -> None:
        with self._lock:
            self._free.setdefault(state.batch, []).append(state)
