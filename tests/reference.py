"""Test-only numerics: the PSNR of docs/DESIGN.md §6 and a numpy log-mel reference of openai-whisper's front end.

Neither is used at run time (the MelSpectrogram component computes the log-mel); both live here so
that the package holds only what it runs.
"""

from __future__ import annotations

import math

import numpy as np

from whisperane.audio import HOP_LENGTH, N_FFT
from whisperane.convert.mel import mel_filters


def psnr(ref: np.ndarray, x: np.ndarray) -> float:
    """docs/DESIGN.md §6: 20 log10((max|ref| + 1e-5) / (RMSE + 1e-10))."""
    ref = np.asarray(ref, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    rmse = math.sqrt(float(np.mean((ref - x) ** 2)))
    return 20 * math.log10((float(np.abs(ref).max()) + 1e-5) / (rmse + 1e-10))


def hann_window(length: int = N_FFT) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default), float64."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(length) / length)


def log_mel_spectrogram_numpy(audio: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """openai-whisper's log-mel spectrogram [n_mels, len(audio) // HOP_LENGTH] float32, in numpy.

    Reflect-padded centred STFT (n_fft 400, hop 160, periodic Hann), power spectrum, the last frame
    dropped, Slaney mel filters, log10 clamped at 1e-10, dynamic range limited to 8 (i.e. 80 dB) below
    the maximum, scaled by (x + 4) / 4. Computed in float64, in blocks of frames to bound memory.
    """
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if padding > 0:
        x = np.pad(x, (0, padding))
    x = np.pad(x, (N_FFT // 2, N_FFT // 2), mode="reflect")
    n_frames = 1 + (len(x) - N_FFT) // HOP_LENGTH - 1  # the last STFT frame is dropped, as Whisper does
    filters = mel_filters(n_mels).astype(np.float64)
    window = hann_window(N_FFT)
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP_LENGTH][: max(n_frames, 0)]
    mel = np.empty((n_mels, len(frames)), dtype=np.float64)
    block = 4096
    for i in range(0, len(frames), block):
        spectrum = np.fft.rfft(frames[i : i + block] * window, axis=-1)
        power = spectrum.real**2 + spectrum.imag**2
        mel[:, i : i + block] = filters @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    if log_spec.size:
        log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)
