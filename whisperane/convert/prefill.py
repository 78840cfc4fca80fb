"""The TextDecoderContextPrefill table: K/V of the forced prefix for every (task, language).

As WhisperKit does it, each entry is the batch mean over encoder outputs of random inputs: the self-attention
K/V of the prefix depend on the audio only through the cross-attention of earlier layers, weakly, so one
table serves every window. The random inputs are white noise at -20 to -90 dBFS through the real log-mel:
measured on base against exact prefill (es, en, de, ja clips), uniformly random log-mels gave K 16-18 dB and
changed the first greedy token of the de clip, noise audio gives K 26-28 dB, V 22-24 dB and the same first
token on all four. It is an approximation; exact prefill stays available (and is the runtime's default).
"""

from __future__ import annotations

import numpy as np
import torch

from ..audio import N_SAMPLES
from ..bundle import MASK_VALUE
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
    """
    batch = enc_k.shape[0]
    dl = enc_k.shape[1]
    # One contiguous tensor per layer: a layer's slice of the concatenated [B, d*L, 1, F] is strided, and
    # splitting its heads would copy it in every call (70 % of a call's time on base, 198 calls).
    enc_k, enc_v = _per_layer(enc_k, decoder.dims.n_text_layer), _per_layer(enc_v, decoder.dims.n_text_layer)
    empty = torch.zeros(batch, dl, 1, cache_length)
    pad = torch.full((batch, cache_length), MASK_VALUE)
    zero = torch.zeros(batch, dtype=torch.int32)
    langs = language_tokens or [None]
    tasks = task_tokens or [None]
    p = 3 if language_tokens else 1
    keys = np.zeros((len(tasks), len(langs), dl, p), dtype=np.float32)
    values = np.zeros_like(keys)
    with torch.no_grad():
        for ti, task in enumerate(tasks):
            for li, lang in enumerate(langs):
                prefix = [sot] if lang is None else [sot, lang, task]
                ids = torch.tensor([prefix] * batch, dtype=torch.int32)
                _, k, v, _ = decoder(ids, zero, empty, empty, pad, enc_k, enc_v)
                keys[ti, li] = k.mean(dim=0)[:, 0].numpy()
                values[ti, li] = v.mean(dim=0)[:, 0].numpy()
    return keys, values


def _per_layer(cache: torch.Tensor, n_layer: int) -> list[torch.Tensor]:
    """[B, d*L, 1, F] -> L contiguous [B, d, 1, F] (the decoder takes either form)."""
    return [part.contiguous() for part in cache.chunk(n_layer, dim=1)]
