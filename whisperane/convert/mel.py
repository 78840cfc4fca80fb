"""openai-whisper's mel filter bank, as librosa computes it (Slaney scale and norm): the MelSpectrogram component's
constant, computed once at conversion."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..audio import N_FFT, SAMPLE_RATE


def _hz_to_mel_slaney(freq: np.ndarray) -> np.ndarray:
    freq = np.asarray(freq, dtype=np.float64)
    f_sp = 200.0 / 3  # linear part: 3 mels per 200 Hz
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    mels = freq / f_sp
    log_region = freq >= min_log_hz
    mels[log_region] = min_log_mel + np.log(freq[log_region] / min_log_hz) / logstep
    return mels


def _mel_to_hz_slaney(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    freqs = f_sp * mels
    log_region = mels >= min_log_mel
    freqs[log_region] = min_log_hz * np.exp(logstep * (mels[log_region] - min_log_mel))
    return freqs


@lru_cache(maxsize=4)
def _mel_filters(n_mels: int, sample_rate: int, n_fft: int) -> np.ndarray:
    fft_freqs = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    mel_edges = np.linspace(
        _hz_to_mel_slaney(np.array([0.0]))[0], _hz_to_mel_slaney(np.array([sample_rate / 2]))[0], n_mels + 2
    )
    hz_edges = _mel_to_hz_slaney(mel_edges)
    widths = np.diff(hz_edges)
    ramps = hz_edges[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    # Slaney normalisation: each triangle has unit area in Hz, so the bands are roughly equal in energy.
    weights *= (2.0 / (hz_edges[2:] - hz_edges[:-2]))[:, None]
    return weights.astype(np.float32)


def mel_filters(n_mels: int) -> np.ndarray:
    """Slaney-scale, Slaney-normalised mel filter bank [n_mels, N_FFT // 2 + 1] float32 (what
    ``librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)`` returns and openai-whisper ships)."""
    if n_mels <= 0:
        raise ValueError(f"n_mels must be positive, got {n_mels}")
    return _mel_filters(int(n_mels), SAMPLE_RATE, N_FFT).copy()
