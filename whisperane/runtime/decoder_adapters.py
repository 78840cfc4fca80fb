"""The batch-B decoder: one adapter per bundle kind, chosen once at load time (``runtime.sessions``).

Rows of one decoder call can be the samples (or beams) of one window, or different windows (docs/DESIGN.md §8).
Every row has its own position in the self-attention cache (``runtime.state``); the cross-attention K/V come in
with batch 1 (shared by every row, broadcast inside the graph) or with batch B (one window per row).

Adapters:

- ``OneHotDecoder``: the contract's TextDecoder (ONNX float32, Core ML): the caches go in whole, the current
  token's K/V is blended in through ``kv_cache_update_mask``; TextDecoderSequence (when the bundle has one)
  runs prompts and the alignment pass in one call.
- ``AppendingDecoder``: ONNX Runtime's int8 TextDecoderSequence serves both uses: one-token calls append the
  token's K/V inside the graph (one session holds the weights, not two); each cache is one input per layer,
  of any length (``GrowingState``), and the host looks token embeddings up in ``TokenTable``.
- ``runtime.coreml.StatefulDecoder``: Core ML's TextDecoderStateful (macOS 15): the caches live in an MLState.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contract import (
    ALIGNMENT_WEIGHTS,
    CACHE_LENGTH,
    CROSS_KEY,
    CROSS_VALUE,
    INPUT_IDS,
    KEY_UPDATES,
    LOGIT_POSITIONS,
    LOGITS,
    LOGPROB_POSITIONS,
    LOGPROB_TOKENS,
    PADDING_MASK,
    TOKEN_EMBEDDINGS,
    TOKEN_LOGPROBS,
    UPDATE_MASK,
    VALUE_UPDATES,
)
from ..errors import ModelError
from .executors import Component
from .state import CacheLayout, DecoderState, GrowingState, StatePool

SHORT_SEQUENCE = 4  # up to this many tokens, ``forward`` runs single steps (one call costs more than 4 steps)
SEQUENCE_UPDATES = [KEY_UPDATES, VALUE_UPDATES]
NO_POSITIONS = np.zeros(0, dtype=np.int32)


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis, keepdims; -inf for rows that are all -inf.

    The exponentials are taken in the input's precision (float32 logits: faster than float64 over the
    vocabulary, once per decoded token) and summed in float64.
    """
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True, dtype=np.float64))


# Rows of the logits normalised at once. logsumexp makes two temporaries of the rows' size: two rows of a
# vocabulary stay in a core's L2 cache, eight do not.
PROBABILITY_ROWS = 2


def text_token_probabilities(logits: np.ndarray, text_tokens: Sequence[int], eot: int) -> np.ndarray:
    """Probability of each text token under the text vocabulary (softmax over ids < eot), as openai.

    ``logits`` [len(text_tokens) (+ more), V]: row k is the position that predicts ``text_tokens[k]``
    (the same rows as the weights passed to ``find_alignment``, without the eot row).
    """
    n = len(text_tokens)
    scores = np.asarray(logits, dtype=np.float32)[:n, :eot]
    picked = scores[np.arange(n), np.asarray(text_tokens, dtype=np.int64)]
    # Rows in blocks: logsumexp's intermediates over all rows at once would be two more copies of the logits.
    norms = np.empty(n)
    for i in range(0, n, PROBABILITY_ROWS):
        norms[i : i + PROBABILITY_ROWS] = logsumexp(scores[i : i + PROBABILITY_ROWS])[:, 0]
    return np.exp(picked - norms)


class TokenTable:
    """The int8 decoder's token embedding, looked up on the host from a memory-mapped ``.npy`` of packed rows
    (each row: d uint8 values with zero point 128, then d / block fp32 block scales; written by the converter's
    ``quantize.pack_rows``). Only the pages of looked-up tokens become resident."""

    def __init__(self, path: Path, n_vocab: int, dim: int):
        try:
            # a plain view of the mapping: indexing a numpy.memmap builds memmap objects, a cost on every step
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
    names = tuple(n for n in decoder_inputs if n.startswith((CROSS_KEY, CROSS_VALUE)))
    missing = [n for n in names if n not in encoder_outputs]
    if not missing:
        return CrossAttentionReader(names, True, n_layer)
    if set(missing) == {CROSS_KEY, CROSS_VALUE} and f"{CROSS_KEY}_0" in encoder_outputs:
        return CrossAttentionReader(names, False, n_layer)
    raise ModelError(f"the decoder takes {', '.join(missing)}, which the encoder does not give")


Logits = np.ndarray  # [B, V] for a step, [B, T, V] for T tokens
Alignment = np.ndarray  # [B, A, F] for a step, [B, A, T, F] for T tokens


class Decoder:
    """The decoder of one bundle kind. ``step`` runs one token per row, ``forward`` T tokens per row (a prompt,
    the forced prefix, the alignment pass); both write the rows' K/V into ``state`` at the rows' positions."""

    def __init__(self, layout: CacheLayout):
        self.layout = layout
        self.pool = StatePool(lambda batch: DecoderState(self.layout, batch))

    def step(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention) -> tuple[Logits, Alignment]:
        raise NotImplementedError

    def forward(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention,
                need_logits: bool = True) -> tuple[Logits | None, Alignment | None]:
        """T tokens per row (tokens [B, T]) as single steps. ``need_logits=False`` only fills the cache."""
        state.check_room(tokens.shape[1])
        logits, align = zip(*(self.step(state, tokens[:, i], cross) for i in range(tokens.shape[1])), strict=True)
        return (np.stack(logits, axis=1), np.stack(align, axis=2)) if need_logits else (None, None)

    def score(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention, first: int,
              targets: np.ndarray, text_vocab: int) -> tuple[np.ndarray, Alignment]:
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

    def __init__(self, layout: CacheLayout, step_component: Component,
                 sequence: Callable[[], Component | None] = lambda: None):
        super().__init__(layout)
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
            INPUT_IDS: tokens.astype(np.int32), CACHE_LENGTH: state.lengths, **state.cache_feeds,
            UPDATE_MASK: state.update, PADDING_MASK: state.padding, **cross.feeds,
        }
        out = self.component.run(feeds)
        state.write(out[KEY_UPDATES], out[VALUE_UPDATES])
        return out[LOGITS][:, 0, :], out[ALIGNMENT_WEIGHTS]

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
        if graph is None:
            return super().score(state, tokens, cross, first, targets, text_vocab)
        return graph.run_scored(state, graph.feeds(state, tokens, cross), first, targets)


@dataclass(frozen=True)
class SequenceGraph:
    """A TextDecoderSequence of the current converter revision (older bundles are refused at load time): it
    takes caches of any length and ``logit_positions`` (which new tokens get logits), returns the
    text-vocabulary log-probabilities of tokens asked for, and its alignment weights hold each layer's heads
    as a block of rows, [B, A * T, F] (a prompt's last layer has none)."""

    component: Component

    @classmethod
    def of(cls, component: Component) -> SequenceGraph:
        return cls(component)

    def feeds(self, state: DecoderState, tokens: np.ndarray, cross: CrossAttention) -> dict[str, np.ndarray]:
        return {INPUT_IDS: tokens.astype(np.int32), CACHE_LENGTH: state.lengths, **state.call_feeds(True),
                **cross.feeds}

    def run(self, state: DecoderState, feeds: dict, need_logits: bool) -> tuple:
        """One multi-token call: the tokens' K/V are appended inside the graph and written to ``state``; without
        ``need_logits`` the vocabulary projection (the larger part of the call) is not computed where the graph
        selects the positions it projects; no token is scored."""
        t = feeds[INPUT_IDS].shape[1]
        state.check_room(t)
        feeds[LOGIT_POSITIONS] = np.arange(t if need_logits else 0, dtype=np.int32)
        feeds[LOGPROB_POSITIONS] = NO_POSITIONS
        feeds[LOGPROB_TOKENS] = np.zeros((feeds[INPUT_IDS].shape[0], 0), dtype=np.int32)
        outputs = [LOGITS, *SEQUENCE_UPDATES, ALIGNMENT_WEIGHTS] if need_logits else SEQUENCE_UPDATES
        out = self.component.run(feeds, outputs)
        state.write(out[KEY_UPDATES], out[VALUE_UPDATES])
        if not need_logits:
            return None, None
        logits = out[LOGITS]  # position-major rows [T * B, V], as the projection wrote them
        logits = logits.reshape(t, -1, logits.shape[-1]).transpose(1, 0, 2)
        return logits, self.alignment(out, t)

    def run_scored(self, state: DecoderState, feeds: dict, first: int, targets: np.ndarray) -> tuple:
        """``Decoder.score`` in one call of a graph that ``scores`` tokens: the log-probabilities of the tokens
        asked for, without logits."""
        state.check_room(feeds[INPUT_IDS].shape[1])
        feeds[LOGIT_POSITIONS] = NO_POSITIONS
        feeds[LOGPROB_POSITIONS] = np.arange(first, first + targets.shape[1], dtype=np.int32)
        feeds[LOGPROB_TOKENS] = targets.astype(np.int32)
        out = self.component.run(feeds, [TOKEN_LOGPROBS, *SEQUENCE_UPDATES, ALIGNMENT_WEIGHTS])
        state.write(out[KEY_UPDATES], out[VALUE_UPDATES])
        return np.exp(out[TOKEN_LOGPROBS].astype(np.float64)), self.alignment(out, feeds[INPUT_IDS].shape[1])

    def alignment(self, out: dict[str, np.ndarray], tokens: int) -> Alignment:
        """A call's alignment weights as [B, A, T, F]: a view of the graph's blocks of rows (that array's memory
        order), no copy."""
        w = out[ALIGNMENT_WEIGHTS]
        return w.reshape(w.shape[0], -1, tokens, w.shape[-1])


class AppendingDecoder(Decoder):
    """ONNX Runtime's int8 TextDecoderSequence for every call: a one-token call appends the token's K/V inside
    the graph (as fast a step as the one-hot form), so one session holds the weights.
    The token embeddings are looked up on the host (``TokenTable``); each cache is one input per layer."""

    def __init__(self, layout: CacheLayout, component: Component, table: TokenTable):
        super().__init__(layout)
        self.component = component
        self.graph = SequenceGraph.of(component)
        self.table = table
        self.pool = StatePool(lambda batch: GrowingState(self.layout, batch))

    def _feeds(self, state, tokens, cross) -> dict[str, np.ndarray]:
        feeds = self.graph.feeds(state, tokens, cross)
        feeds[TOKEN_EMBEDDINGS] = self.table.lookup(tokens)
        return feeds

    def step(self, state, tokens, cross):
        logits, align = self.graph.run(state, self._feeds(state, tokens[:, None], cross), True)
        return logits[:, 0, :], align[:, :, 0]

    def forward(self, state, tokens, cross, need_logits=True):
        return self.graph.run(state, self._feeds(state, tokens, cross), need_logits)

    def score(self, state, tokens, cross, first, targets, text_vocab):
        return self.graph.run_scored(state, self._feeds(state, tokens, cross), first, targets)
