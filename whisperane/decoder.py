"""The batch-B decoder: one adapter per bundle kind, chosen once at load time, and the per-call state.

Rows of one decoder call can be the samples (or beams) of one window, or different windows (DESIGN.md §8).
Every row has its own position in the fixed-length self-attention cache, its own one-hot update mask and
padding mask; the cross-attention K/V come in with batch 1 (shared by every row, broadcast inside the graph)
or with batch B (one window per row).

Adapters (``open_decoder`` picks one from the bundle kind):

- ``OneHotDecoder``: the contract's TextDecoder (ONNX float32, Core ML): the caches go in whole, the current
  token's K/V is blended in through ``kv_cache_update_mask``; TextDecoderSequence (when the bundle has one)
  runs prompts and the alignment pass in one call.
- ``AppendingDecoder``: ONNX Runtime's int8 TextDecoderSequence serves both uses: one-token calls append the
  token's K/V inside the graph (one session holds the weights, not two); each cache is one input per layer
  and the host looks token embeddings up in ``TokenTable``.
- ``StatefulDecoder``: Core ML's TextDecoderStateful (macOS 15): the caches live in an MLState per call.

The state of a call (``DecoderState``) belongs to the call: one loaded model decodes from several threads.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bundle import MASK_VALUE
from .errors import ModelError
from .executors import Component

SHORT_SEQUENCE = 4  # up to this many tokens, ``forward`` runs single steps (measured: 4 steps < 1 call)
LOGIT_POSITIONS = "logit_positions"  # TextDecoderSequence's input: which of the new tokens get logits
# TextDecoderSequence's inputs (converter revision 12 on): positions, and each row's token at them, whose
# text-vocabulary log-probabilities (the output TOKEN_LOGPROBS, [B, Q]) the alignment pass reads
LOGPROB_POSITIONS, LOGPROB_TOKENS, TOKEN_LOGPROBS = "logprob_positions", "logprob_tokens", "token_logprobs"
SEQUENCE_UPDATES = ["key_cache_updates", "value_cache_updates"]
NO_POSITIONS = np.zeros(0, dtype=np.int32)


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis, keepdims; -inf for rows that are all -inf.

    The exponentials are taken in the input's precision (float32 logits: half the time of float64 over the
    vocabulary, once per decoded token) and summed in float64.
    """
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True, dtype=np.float64))


# Rows of the logits normalised at once. logsumexp makes two temporaries of the rows' size: 2 rows (0.4 MB each)
# stay in a core's L2, 8 rows (1.6 MB each) did not: [81, 51864] 12.5 -> 4.3 ms, and the JFK run's peak -1.3 MiB.
PROBABILITY_ROWS = 2


def text_token_probabilities(logits: np.ndarray, text_tokens: Sequence[int], eot: int) -> np.ndarray:
    """Probability of each text token under the text vocabulary (softmax over ids < eot), as openai.

    ``logits`` [len(text_tokens) (+ more), V]: row k is the position that predicts ``text_tokens[k]``
    (the same rows as the weights passed to ``find_alignment``, without the eot row).
    """
    n = len(text_tokens)
    scores = np.asarray(logits, dtype=np.float32)[:n, :eot]
    picked = scores[np.arange(n), np.asarray(text_tokens, dtype=np.int64)]
    # Rows in blocks: logsumexp's intermediates over all rows at once were two more copies of the logits
    # (JFK, tiny.en: +8 MB at the peak of the whole run).
    norms = np.empty(n)
    for i in range(0, n, PROBABILITY_ROWS):
        norms[i : i + PROBABILITY_ROWS] = logsumexp(scores[i : i + PROBABILITY_ROWS])[:, 0]
    return np.exp(picked - norms)


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
        return {**dict(zip(self.layout.names("key_cache"), self.keys, strict=True)),
                **dict(zip(self.layout.names("value_cache"), self.values, strict=True))}  # fmt: skip

    def call_feeds(self, any_length: bool) -> dict[str, np.ndarray]:
        """The caches and the padding mask as a decoder call takes them. A graph whose cache length is free
        (``SequenceGraph.any_length``) gets none of the S positions while every row is empty: a
        window's prompt and its alignment pass then attend over their own tokens alone, not S masked positions
        besides (tiny.en int8: 200-token prompt 41.5 -> 32.2 ms, alignment pass 33.5 -> 29.2 ms; the same outputs)."""
        if any_length and not self.lengths.any():
            return {**{n: c[..., :0] for n, c in self.cache_feeds.items()}, "decoder_key_padding_mask": self.padding[:, :0]}
        return {**self.cache_feeds, "decoder_key_padding_mask": self.padding}

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
                             f"({self.layout.length} positions)")  # fmt: skip

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
        to Python once, as a list: between two one-token steps the host's work (~0.4 ms against a ~2.5 ms step,
        tiny.en) runs on caches the step has just evicted, where every numpy reduction costs tens of us."""
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
                                  (self.padding, self.batch, MASK_VALUE)]:  # fmt: skip
            old = flat[: rows * self.capacity].reshape(rows, self.capacity)
            new = flat[: rows * capacity].reshape(rows, capacity)
            new[:, :kept] = old[:, :kept]
            new[:, kept:] = empty
        self.capacity = capacity
        self.version += 1


class GrowingState(DecoderState):
    """A ``DecoderState`` whose caches hold only the positions its rows have reached, rounded up to
    CAPACITY_BLOCK, for graphs that take caches of any length (``SequenceGraph.any_length``): a one-token step
    then reads the filled part of each cache rather than all S positions (replayed steps of the long file's
    first 95 s: tiny.en 2.23 -> 2.04 ms, base 5.09 -> 4.75 ms, every output byte-identical). The caches are
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


class TokenTable:
    """The int8 decoder's token embedding, looked up on the host from a memory-mapped ``.npy`` of packed rows
    (each row: d uint8 values with zero point 128, then d / block fp32 block scales; written by the converter's
    ``quantize.pack_rows``). Only the pages of looked-up tokens become resident."""

    def __init__(self, path: Path, n_vocab: int, dim: int):
        try:
            # a plain view of the mapping: indexing a numpy.memmap builds memmap objects (~10 us a step)
            self.rows = np.asarray(np.load(path, mmap_mode="r"))
        except (OSError, ValueError) as e:
            raise ModelError(f"{path}: unreadable token table ({e})") from None
        extra = self.rows.shape[1] - dim if self.rows.ndim == 2 else 0
        if self.rows.dtype != np.uint8 or self.rows.shape[0] != n_vocab or extra <= 0 or (4 * dim) % extra:
            raise ModelError(f"{path}: not a [{n_vocab}, {dim} + scales] uint8 token table ({self.rows.dtype} {self.rows.shape})")
        self.dim = dim
        self.block = 4 * dim // extra

    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """Token ids [B, T] -> float32 embeddings [B, T, d]."""
        packed = self.rows[tokens]
        lead = packed.shape[:-1]
        q = packed[..., : self.dim].reshape(*lead, self.dim // self.block, self.block)
        scales = np.ascontiguousarray(packed[..., self.dim :]).view("<f4")
        return ((q.astype(np.float32) - 128.0) * scales[..., None]).reshape(*lead, self.dim)


@dataclass(frozen=True)
class CrossAttention:
    """One encoder call's cross-attention K/V, as the decoder takes them; batch 1 (shared by every row) or
    batch B (one window per row)."""

    feeds: dict[str, np.ndarray]
    batch: int

    def row(self, i: int) -> CrossAttention:
        """Window ``i`` of a batch, as a batch-1 view (no copy)."""
        return CrossAttention({k: v[i : i + 1] for k, v in self.feeds.items()}, 1)

    def first_rows(self, n: int) -> CrossAttention:
        """The first ``n`` windows, as views (no copy); a shared batch-1 K/V stays as it is."""
        return self if self.batch == 1 else CrossAttention({k: v[:n] for k, v in self.feeds.items()}, n)

    def set_row(self, i: int, window: CrossAttention) -> None:
        """Write a batch-1 K/V (one window) into row ``i``."""
        for name, value in window.feeds.items():
            self.feeds[name][i] = value[0]

    def swap_rows(self, i: int, j: int) -> None:
        """Exchange windows ``i`` and ``j`` in place (a batch of one window per row)."""
        for v in self.feeds.values():
            row = v[i].copy()
            v[i] = v[j]
            v[j] = row


def _concatenated(outputs: dict[str, np.ndarray], which: str, n_layer: int) -> np.ndarray:
    return np.concatenate([outputs[f"{which}_{i}"] for i in range(n_layer)], axis=1)


@dataclass(frozen=True)
class CrossAttentionReader:
    """How the encoder's outputs become the decoder's cross inputs (``names``): as they are (``in_place``: the
    encoder can write them straight into a batch's arrays), or concatenated over the ``n_layer`` layers (a
    per-layer encoder feeding a decoder of the contract). Chosen once, at load time."""

    names: tuple[str, ...]
    in_place: bool
    n_layer: int

    def __call__(self, out: dict[str, np.ndarray]) -> CrossAttention:
        feeds = {n: out[n] if self.in_place else _concatenated(out, n, self.n_layer) for n in self.names}
        return CrossAttention(feeds, feeds[self.names[0]].shape[0])


def cross_attention_reader(encoder_outputs: dict, decoder_inputs: dict, n_layer: int) -> CrossAttentionReader:
    names = tuple(n for n in decoder_inputs if n.startswith("encoder_attn_"))
    missing = [n for n in names if n not in encoder_outputs]
    if not missing:
        return CrossAttentionReader(names, True, n_layer)
    if set(missing) == {"encoder_attn_key_cache", "encoder_attn_value_cache"} and "encoder_attn_key_cache_0" in encoder_outputs:
        return CrossAttentionReader(names, False, n_layer)
    raise ModelError(f"the decoder takes {', '.join(missing)}, which the encoder does not give")


Logits = np.ndarray  # [B, V] for a step, [B, T, V] for T tokens
Alignment = np.ndarray  # [B, A, F] for a step, [B, A, T, F] for T tokens


class Decoder:
    """The decoder of one bundle kind. ``step`` runs one token per row, ``forward`` T tokens per row (a prompt,
    the forced prefix, the alignment pass); both write the rows' K/V into ``state`` at the rows' positions."""

    def __init__(self, layout: CacheLayout, n_vocab: int):
        self.layout = layout
        self.n_vocab = n_vocab
        self.pool = StatePool(lambda batch: DecoderState(self.layout, batch))

    def step(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention) -> tuple[Logits, Alignment]:
        raise NotImplementedError

    def forward(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention,
                need_logits: bool = True) -> tuple[Logits | None, Alignment | None]:  # fmt: skip
        """T tokens per row (tokens [B, T]) as single steps. ``need_logits=False`` only fills the cache."""
        state.check_room(tokens.shape[1])
        logits, align = zip(*(self.step(state, tokens[:, i], cross) for i in range(tokens.shape[1])), strict=True)
        return (np.stack(logits, axis=1), np.stack(align, axis=2)) if need_logits else (None, None)

    def score(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention, first: int,
              targets: np.ndarray, text_vocab: int) -> tuple[np.ndarray, Alignment]:  # fmt: skip
        """The alignment pass: ``tokens`` [B, T] teacher-forced; returns the probability of ``targets[:, q]``
        at position ``first + q`` under the text vocabulary (softmax over ids < ``text_vocab``, as openai's
        word probabilities) [B, Q], and the alignment weights [B, A, T, F]. Here from the logits, on the host;
        graphs that return the probabilities themselves skip that (``SequenceGraph.run_scored``)."""
        logits, align = self.forward(state, tokens, cross)
        rows = [text_token_probabilities(logits[r, first:], targets[r], text_vocab) for r in range(len(targets))]
        return np.stack(rows), align


class OneHotDecoder(Decoder):
    """The contract's TextDecoder: the caches go in whole and the current token's K/V is blended in through the
    one-hot ``kv_cache_update_mask``; a TextDecoderSequence (appending T tokens in one call), when the bundle
    has one, runs sequences longer than SHORT_SEQUENCE."""

    def __init__(self, layout: CacheLayout, n_vocab: int, step_component: Component,
                 sequence: Callable[[], Component | None] = lambda: None):  # fmt: skip
        super().__init__(layout, n_vocab)
        self.component = step_component
        self.sequence = sequence  # waits for a component loaded in the background
        self._graph: SequenceGraph | None = None  # the sequence component's variants, once it has come

    def _mark_position(self, state: DecoderState) -> None:
        state.check_room(1)
        state.update.fill(0.0)
        state.update[state.rows, state.lengths] = 1.0
        state.padding[state.rows, state.lengths] = 0.0

    def step(self, state, tokens, cross):
        self._mark_position(state)
        feeds = {
            "input_ids": tokens.astype(np.int32), "cache_length": state.lengths, **state.cache_feeds,
            "kv_cache_update_mask": state.update, "decoder_key_padding_mask": state.padding, **cross.feeds,
        }  # fmt: skip
        out = self.component.run(feeds)
        state.write(out["key_cache_updates"], out["value_cache_updates"])
        return out["logits"][:, 0, :], out["alignment_heads_weights"]

    def _sequence_for(self, tokens: np.ndarray) -> SequenceGraph | None:
        """The multi-token graph for ``tokens`` [B, T]: none for a few tokens (a prefix after sot costs less as
        single steps than as one call) or where the bundle has none. Its variants are read once, when the
        component (loaded in the background) first arrives."""
        if tokens.shape[1] <= SHORT_SEQUENCE or (component := self.sequence()) is None:
            return None
        if self._graph is None or self._graph.component is not component:
            self._graph = SequenceGraph.of(component)
        return self._graph

    def forward(self, state, tokens, cross, need_logits=True):
        graph = self._sequence_for(tokens)
        if graph is None:
            return super().forward(state, tokens, cross, need_logits)
        return graph.run(state, graph.feeds(state, tokens, cross), need_logits)

    def score(self, state, tokens, cross, first, targets, text_vocab):
        graph = self._sequence_for(tokens)
        if graph is None or not graph.scores:
            return super().score(state, tokens, cross, first, targets, text_vocab)
        return graph.run_scored(state, graph.feeds(state, tokens, cross), first, targets)


@dataclass(frozen=True)
class SequenceGraph:
    """A TextDecoderSequence and what its converter revision gives, read once from its inputs and outputs
    (``of``), so no call inspects the graph:

    - ``selects``: it takes ``logit_positions`` (revision 10 on); older graphs compute every position's logits;
    - ``scores``: it returns token log-probabilities (revision 12 on);
    - ``any_length``: it takes caches of any length (revision 16 on); older ones exactly S positions;
    - ``weight_rows``: its alignment weights hold each layer's heads as a block of rows, [B, A * T, F]
      (revision 17 on: a prompt's last layer has none, ``modules.tail_start``); older ones give [B, A, T, F].
    """

    component: Component
    selects: bool
    scores: bool
    any_length: bool
    weight_rows: bool

    @classmethod
    def of(cls, component: Component) -> SequenceGraph:
        padding = component.inputs.get("decoder_key_padding_mask", ())
        return cls(component, selects=LOGIT_POSITIONS in component.inputs,
                   scores=LOGPROB_POSITIONS in component.inputs,
                   any_length=len(padding) == 2 and not isinstance(padding[1], int),
                   weight_rows=len(component.outputs.get("alignment_heads_weights", ())) == 3)  # fmt: skip

    def feeds(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention) -> dict[str, np.ndarray]:
        return {"input_ids": tokens.astype(np.int32), "cache_length": state.lengths,
                **state.call_feeds(self.any_length), **cross.feeds}  # fmt: skip

    def run(self, state: DecoderState, feeds: dict, need_logits: bool) -> tuple:
        """One multi-token call: the tokens' K/V are appended inside the graph and written to ``state``; without
        ``need_logits`` the vocabulary projection (the larger part of the call) is not computed where the graph
        ``selects`` the positions it projects. A graph that ``scores`` tokens is asked for none."""
        t = feeds["input_ids"].shape[1]
        state.check_room(t)
        if self.selects:
            feeds[LOGIT_POSITIONS] = np.arange(t if need_logits else 0, dtype=np.int32)
        if self.scores:
            feeds[LOGPROB_POSITIONS] = NO_POSITIONS
            feeds[LOGPROB_TOKENS] = np.zeros((feeds["input_ids"].shape[0], 0), dtype=np.int32)
        outputs = ["logits", *SEQUENCE_UPDATES, "alignment_heads_weights"] if need_logits else SEQUENCE_UPDATES
        out = self.component.run(feeds, outputs)
        state.write(out["key_cache_updates"], out["value_cache_updates"])
        if not need_logits:
            return None, None
        logits = out["logits"]
        if self.scores:  # position-major rows [T * B, V], as the projection wrote them
            logits = logits.reshape(t, -1, logits.shape[-1]).transpose(1, 0, 2)
        return logits, self.alignment(out, t)

    def run_scored(self, state: DecoderState, feeds: dict, first: int, targets: np.ndarray) -> tuple:
        """``Decoder.score`` in one call of a graph that ``scores`` tokens: the log-probabilities of the tokens
        asked for, without logits."""
        state.check_room(feeds["input_ids"].shape[1])
        feeds[LOGIT_POSITIONS] = NO_POSITIONS
        feeds[LOGPROB_POSITIONS] = np.arange(first, first + targets.shape[1], dtype=np.int32)
        feeds[LOGPROB_TOKENS] = targets.astype(np.int32)
        out = self.component.run(feeds, [TOKEN_LOGPROBS, *SEQUENCE_UPDATES, "alignment_heads_weights"])
        state.write(out["key_cache_updates"], out["value_cache_updates"])
        return np.exp(out[TOKEN_LOGPROBS].astype(np.float64)), self.alignment(out, feeds["input_ids"].shape[1])

    def alignment(self, out: dict[str, np.ndarray], tokens: int) -> Alignment:
        """A call's alignment weights as [B, A, T, F]: from ``weight_rows`` graphs a view of their blocks of
        rows (that array's memory order), no copy."""
        w = out["alignment_heads_weights"]
        return w.reshape(w.shape[0], -1, tokens, w.shape[-1]) if self.weight_rows else w


class AppendingDecoder(Decoder):
    """ONNX Runtime's int8 TextDecoderSequence for every call: a one-token call appends the token's K/V inside
    the graph (4.6 vs 4.5 ms a step on tiny.en against the one-hot form), so one session holds the weights.
    The token embeddings are looked up on the host (``TokenTable``); each cache is one input per layer."""

    def __init__(self, layout: CacheLayout, n_vocab: int, component: Component, table: TokenTable):
        super().__init__(layout, n_vocab)
        self.component = component
        self.graph = SequenceGraph.of(component)
        self.table = table
        if self.graph.any_length:
            self.pool = StatePool(lambda batch: GrowingState(self.layout, batch))

    def _feeds(self, state, tokens, cross) -> dict[str, np.ndarray]:
        feeds = self.graph.feeds(state, tokens, cross)
        feeds["token_embeddings"] = self.table.lookup(tokens)
        return feeds

    def step(self, state, tokens, cross):
        logits, align = self.graph.run(state, self._feeds(state, tokens[:, None], cross), True)
        return logits[:, 0, :], align[:, :, 0]

    def forward(self, state, tokens, cross, need_logits=True):
        return self.graph.run(state, self._feeds(state, tokens, cross), need_logits)

    def score(self, state, tokens, cross, first, targets, text_vocab):
        if not self.graph.scores:
            return super().score(state, tokens, cross, first, targets, text_vocab)
        return self.graph.run_scored(state, self._feeds(state, tokens, cross), first, targets)


class StatefulDecoder(OneHotDecoder):
    """Core ML's stateful decoders (macOS 15 / iOS 18): the caches live in an MLState that belongs to the
    call's state (``MLStateRows``); the host keeps only the masks and positions. A state's rows are fixed when
    the package is converted: TextDecoderStateful (``component``) has 1 row; TextDecoderStatefulBeam
    (``batched``, when the bundle has it) has 5, for beams or samples of one window; a group of fewer rows
    leaves the rest idle. Beams are reordered through the MLState (``MLStateRows.select``)."""

    def __init__(
        self, layout: CacheLayout, n_vocab: int, component: Component, batched: Component | None = None
    ):
        super().__init__(layout, n_vocab, component)
        self.batched = batched
        self.pool = StatePool(self._new_state)

    def _new_state(self, batch: int) -> DecoderState:
        if batch == 1:
            return MLStateRows(self.layout, batch, self.component)
        if self.batched is not None and batch <= package_rows(self.batched):
            return MLStateRows(self.layout, batch, self.batched)
        most = package_rows(self.batched) if self.batched is not None else 1
        raise ModelError(
            f"the stateful Core ML decoder runs at most {most} rows at once, not {batch} "
            "(beam_size and best_of up to that; rebuild the bundle for TextDecoderStatefulBeam)"
        )

    def step(self, state, tokens, cross):
        if cross.batch != 1:
            raise ModelError(
                "the stateful Core ML decoder takes one window's cross K/V; decode windows one at a time"
            )
        self._mark_position(state)
        out = state.component.run(state.step_feeds(tokens, cross), state=state.native)
        state.lengths += 1
        return out["logits"][: state.batch, 0, :], out["alignment_heads_weights"][: state.batch]

    def forward(self, state, tokens, cross, need_logits=True):
        return Decoder.forward(self, state, tokens, cross, need_logits)


STATE_NAMES = ("key_cache", "value_cache")


def package_rows(component: Component) -> int:
    """The fixed number of rows of a stateful package (its ``input_ids`` length)."""
    shape = component.inputs.get("input_ids", (1,))
    return int(shape[0]) if shape and isinstance(shape[0], int) else 1


class MLStateRows(DecoderState):
    """The state of one call through a stateful Core ML decoder: ``batch`` rows of a package with P >= batch
    fixed rows. The caches are the package's MLState (``native``, [P, d*L, 1, S] each); the host keeps masks
    and positions for all P rows, rows past ``batch`` idle (zero update mask, so their state never changes;
    fully masked). Cache rows move through ``MLState.read_state``/``write_state`` (coremltools >= 8.1): the
    forced prefix copied from another state, host-side writes (the prefill table), beam reordering. A reorder
    reads and writes both caches whole (tiny.en at 5 rows: 2 x 6.9 MB of fp16 each way a step)."""

    def __init__(self, layout: CacheLayout, batch: int, component: Component):
        rows = package_rows(component)
        self.layout, self.batch, self.component = layout, batch, component
        self._update_rows = np.zeros((rows, layout.length), dtype=np.float32)
        self._padding_rows = np.full((rows, layout.length), MASK_VALUE, dtype=np.float32)
        self._length_rows = np.zeros(rows, dtype=np.int32)
        self._token_rows = np.zeros(rows, dtype=np.int32)
        # views: the host's rows of the arrays fed whole
        self.update, self.padding = self._update_rows[:batch], self._padding_rows[:batch]
        self.lengths = self._length_rows[:batch]
        self.rows = np.arange(batch)
        self.keys, self.values, self.cache_feeds, self._spare = [], [], {}, None  # no host caches
        self.native = component.make_state()

    def step_feeds(self, tokens: np.ndarray, cross: CrossAttention) -> dict[str, np.ndarray]:
        self._token_rows[: self.batch] = tokens
        return {"input_ids": self._token_rows, "cache_length": self._length_rows,
                "kv_cache_update_mask": self._update_rows, "decoder_key_padding_mask": self._padding_rows,
                **cross.feeds}  # fmt: skip

    def caches(self) -> list[np.ndarray]:
        """Copies of the MLState's caches (key, value), [P, d*L, 1, S] in the state's precision (fp16)."""
        try:
            return [np.array(self.native.read_state(name)) for name in STATE_NAMES]
        except AttributeError:  # coremltools 8.0's MLState has no read_state
            raise ModelError("the stateful Core ML decoder needs coremltools >= 8.1 (MLState.read_state); "
                             "pip install -U coremltools") from None  # fmt: skip

    def _store(self, caches: list[np.ndarray]) -> None:
        for name, cache in zip(STATE_NAMES, caches, strict=True):
            self.native.write_state(name, cache)

    def write(self, key: np.ndarray, value: np.ndarray) -> None:
        t = key.shape[3]
        self.check_room(t)
        self.open(t)
        caches = self.caches()
        for cache, update in zip(caches, (key, value), strict=True):
            for r, start in enumerate(self.lengths):
                cache[r, :, :, start : start + t] = update[r if update.shape[0] > 1 else 0]
        self._store(caches)
        self.lengths += t

    def _source(self, other: DecoderState) -> list[np.ndarray]:
        return other.caches() if isinstance(other, MLStateRows) else [other.keys[0], other.values[0]]

    def copy_prefix_from(self, other: DecoderState) -> None:
        n = int(other.lengths[0])
        caches = self.caches()
        for cache, source in zip(caches, self._source(other), strict=True):
            cache[: self.batch, :, :, :n] = source[:1, :, :, :n]
        self._store(caches)
        self.padding[:, :n] = 0.0
        self.padding[:, n:] = MASK_VALUE
        self.lengths[:] = n

    def set_row(self, row: int, other: DecoderState, other_row: int = 0) -> None:
        n = int(other.lengths[other_row])
        caches = self.caches()
        for cache, source in zip(caches, self._source(other), strict=True):
            cache[row, :, :, :n] = source[other_row, :, :, :n]
        self._store(caches)
        self.padding[row] = other.padding[other_row]
        self.lengths[row] = n

    def first_rows(self, n: int) -> DecoderState | None:
        return None  # the rows live in one MLState: finished rows stay in the batch, fed <|endoftext|>

    def select(self, rows: np.ndarray) -> None:
        """Reorder or duplicate rows (beams): read the caches, gather rows up to the longest, write back."""
        rows = np.asarray(rows)
        if (rows == self.rows).all():
            return
        n = self.length
        caches = self.caches()
        for cache in caches:
            cache[: self.batch, :, :, :n] = cache[rows, :, :, :n]
        self._store(caches)
        self.padding[:] = self.padding[rows]
        self.lengths[:] = self.lengths[rows]
