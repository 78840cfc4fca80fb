"""The TextDecoderContextPrefill table: K/V of the forced prefix for every (task, language).

As WhisperKit does it, each entry is the batch mean over encoder outputs of random inputs: the self-attention
K/V of the prefix depend on the audio only through the cross-attention of earlier layers, weakly, so one
table serves every window. The random inputs are white noise at -20 to -90 dBFS through the real log-mel: its
K/V come closer to exact prefill than those of uniformly random log-mels, which can change the first greedy token.
It is an approximation; exact prefill stays available (and is the runtime's default).
"""

from __future__ import annotations

import numpy as np
import torch

from ..audio import N_SAMPLES
from ..contract import MASK_VALUE
from .modules import AudioEncoder, MelSpectrogram, TextDecoderSequence

NOISE_LEVELS_DBFS = (-20, -30, -40, -50, -60, -70, -80, -90)


def random_encoder_outputs(encoder: AudioEncoder, mel: MelSpectrogram, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-attention K/V of white noise at each of NOISE_LEVELS_DBFS, through the log-mel and the encoder."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        mels = [
            mel(torch.from_numpy((10 ** (level / 20) * rng.standard_normal(N_SAMPLES)).astype(np.float32)))
            for level in NOISE_LEVELS_DBFS
        ]
        _, k, v = encoder(torch.cat(mels))
    return k, v


def compute_prefill_table(
    decoder: TextDecoderSequence,
    enc_k: torch.Tensor,
    enc_v: torch.Tensor,
    sot: int,
    language_tokens: list[int],
    task_tokens: list[int],
    cache_length: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Return key/value tables [n_tasks, n_languages, d*L, P].

    Multilingual: the prefix is (sot, language, task), P = 3. English-only: (sot,), P = 1, one row each.

    Every prefix position is computed once, all in one pass per noise window: sot, then each language after it,
    then each (task, language) after its language, as one sequence of 1 + n + 2n tokens in which each token
    attends only to its own prefix (a tree mask; masked scores are exact zeros after the softmax). The outputs
    are those of the 2n separate prefixes up to float rounding; the logits, thrown away here, are not computed.
    """
    prefix_length = 3 if language_tokens else 1
    if prefix_length > cache_length:
        raise ValueError(f"a prefix of {prefix_length} tokens does not fit a cache of {cache_length}")
    n_layer = decoder.dims.n_text_layer
    tree = _PrefixTree(sot, language_tokens, task_tokens)
    # One contiguous tensor per layer: a layer's slice of the concatenated [B, d*L, 1, F] is strided, and
    # splitting its heads would copy it in every call.
    enc_k, enc_v = _per_layer(enc_k, n_layer), _per_layer(enc_v, n_layer)
    n_windows = enc_k[0].shape[0]
    key_sum, value_sum = 0.0, 0.0
    with torch.no_grad():
        # One noise window a pass: a batch of all eight would keep eight windows' cross-attention weights alive
        # in every layer with an alignment head (the heads' weights are views of them): by their shapes about
        # 0.7 GB on base, several GB on the large models.
        for row in range(n_windows):
            k, v = _tree_kv(decoder, tree, [e[row : row + 1] for e in enc_k], [e[row : row + 1] for e in enc_v])
            key_sum, value_sum = key_sum + k, value_sum + v
    return tree.table(key_sum / n_windows), tree.table(value_sum / n_windows)


class _PrefixTree:
    """The tokens of every forced prefix, each shared position once: sot, the n languages, then the 2n
    (task, language) tokens in task-major order; ``parents`` lists the positions a token's prefix holds."""

    def __init__(self, sot: int, language_tokens: list[int], task_tokens: list[int]):
        n, tasks = len(language_tokens), len(task_tokens)
        self.tokens = [sot, *language_tokens, *(t for t in task_tokens for _ in language_tokens)]
        self.positions = [0] + [1] * n + [2] * (n * tasks)
        self.parents = [[0]] + [[0, 1 + i] for i in range(n)] + [[0, 1 + i] for _ in task_tokens for i in range(n)]
        # The table's columns for each (task, language): the positions of sot, the language and the task.
        if n:
            self.columns = [[[0, 1 + i, 1 + n + t * n + i] for i in range(n)] for t in range(tasks)]
        else:
            self.columns = [[[0]]]

    def mask(self) -> torch.Tensor:
        """Additive self-attention mask [T, T]: each token sees its prefix and itself."""
        allowed = torch.eye(len(self.tokens), dtype=torch.bool)
        for row, parents in enumerate(self.parents):
            allowed[row, parents] = True
        return torch.where(allowed, 0.0, MASK_VALUE)

    def table(self, cache: torch.Tensor) -> np.ndarray:
        """[d*L, T] K or V of every token -> [n_tasks, n_languages, d*L, P]."""
        columns = torch.tensor(self.columns)  # [n_tasks, n_languages, P]
        return cache[:, columns].permute(1, 2, 0, 3).contiguous().numpy()


def _tree_kv(
    decoder: TextDecoderSequence, tree: _PrefixTree, enc_k: list[torch.Tensor], enc_v: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-attention K/V [d*L, T] of every token of ``tree`` for one encoder output (batch 1).

    The decoder's blocks directly, with the tree mask: its forward's mask is causal over the new tokens, and it
    would also compute the logits."""
    ids = torch.tensor([tree.tokens], dtype=torch.long)
    x = decoder.embed(decoder.token_embedding(ids) + decoder.positional_embedding[torch.tensor(tree.positions)])

    mask = tree.mask()

    def self_attention(_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, _first: None) -> torch.Tensor:
        return decoder.attend(q, k, v, mask)  # no cache: every position is among the new tokens

    _, keys, values, _ = decoder.run_blocks(x, self_attention, enc_k, enc_v)
    return torch.cat(keys, dim=1)[0, :, 0], torch.cat(values, dim=1)[0, :, 0]


def _per_layer(cache: torch.Tensor, n_layer: int) -> list[torch.Tensor]:
    """[B, d*L, 1, F] -> L contiguous [B, d, 1, F] (the decoder takes either form)."""
    return [part.contiguous() for part in cache.chunk(n_layer, dim=1)]
