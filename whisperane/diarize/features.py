"""The speaker encoder's input, in numpy: Resemblyzer's mel power spectrogram (librosa's ``melspectrogram`` with
its defaults: 25 ms periodic Hann windows every 10 ms, centred on zero padding, power 2, 40 Slaney mels; not a
log-mel) and its volume normalisation to -30 dBFS, increase only (docs/DESIGN.md §9)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..audio import SAMPLE_RATE
from .speaker_model import HOP_LENGTH, N_FFT, NORM_TARGET_DBFS

INT16_MAX = 2**15 - 1  # Resemblyzer measures dBFS on 16-bit sample values


@lru_cache(maxsize=1)
def hann_window() -> np.ndarray:
    """The periodic Hann window of N_FFT samples (``scipy.signal.get_window("hann", N_FFT)``, librosa's)."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def power_spectrum(audio: np.ndarray) -> np.ndarray:
    """Power spectrum frames [1 + len(audio) // HOP_LENGTH, N_FFT // 2 + 1] float32 of 16 kHz ``audio``: frame
    ``t`` is centred on sample ``t * HOP_LENGTH``."""
    audio = np.asarray(audio, dtype=np.float32)
    padded = np.pad(audio, N_FFT // 2)
    n_frames = 1 + len(audio) // HOP_LENGTH
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:n_frames]
    spectrum = np.fft.rfft(frames * hann_window(), axis=1)
    return (spectrum.real**2 + spectrum.imag**2).astype(np.float32)


def mel_power(audio: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Mel power frames [1 + len(audio) // HOP_LENGTH, n_mels] float32 of 16 kHz ``audio``."""
    return to_mels(power_spectrum(audio), filters)


def to_mels(power: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Power spectra [..., N_FFT // 2 + 1] through the mel filters [n_mels, N_FFT // 2 + 1]. Each triangular filter
    is summed over its own bins, without BLAS: numpy's BLAS threads keep spinning after a product and take a core
    from the ONNX Runtime call that follows (the speaker encoder ran at half speed beside them)."""
    shape = power.shape
    flat = power.reshape(-1, shape[-1])
    out = np.zeros((len(flat), filters.shape[0]), dtype=np.float32)
    for m, row in enumerate(filters):
        bins = np.flatnonzero(row)
        if len(bins):
            low, high = bins[0], bins[-1] + 1
            np.einsum("fb,b->f", flat[:, low:high], row[low:high].astype(np.float32), out=out[:, m])
    return out.reshape(*shape[:-1], filters.shape[0])


def bin_frequencies() -> np.ndarray:
    """The centre frequency (Hz) of each of the N_FFT // 2 + 1 power spectrum bins."""
    return np.fft.rfftfreq(N_FFT, 1 / SAMPLE_RATE)


def band_limited_filters(filters: np.ndarray, low: float, high: float) -> np.ndarray:
    """The mel ``filters`` [n_mels, N_FFT // 2 + 1] blind to the bins outside [low, high] Hz: the mels of the
    power spectrum with those bins zeroed."""
    hz = bin_frequencies()
    return (filters * ((hz >= low) & (hz <= high))).astype(np.float32)


def band_edge_ratio(power: np.ndarray, edge: tuple[float, float], above: float) -> np.ndarray:
    """For each partial of ``power`` [n, frames, N_FFT // 2 + 1], its power above ``above`` Hz over its power in
    the ``edge`` band (Hz, the top of a telephone band): near zero where a telephone line cut the audio."""
    hz = bin_frequencies()
    inside = power[..., (hz >= edge[0]) & (hz <= edge[1])].sum(axis=(-2, -1), dtype=np.float64)
    return power[..., hz >= above].sum(axis=(-2, -1), dtype=np.float64) / np.maximum(inside, 1e-20)


def volume_gain(samples: np.ndarray) -> float:
    """The amplitude factor that brings ``samples`` to NORM_TARGET_DBFS, or 1 when they are already louder
    (Resemblyzer's ``normalize_volume(..., increase_only=True)``); 1 for digital silence."""
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) * INT16_MAX if len(samples) else 0.0
    if rms <= 0.0:
        return 1.0
    change_db = NORM_TARGET_DBFS - 20.0 * np.log10(rms / INT16_MAX)
    return float(10.0 ** (change_db / 20.0)) if change_db > 0 else 1.0
