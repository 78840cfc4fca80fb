"""The speaker encoder at run time: Resemblyzer's GE2E voice encoder as an ONNX component (converted once by the
build side, sha256 checked, cached) over ONNX Runtime. ``$WHISPERANE_SPEAKER_MODEL`` names a converted model's
folder (offline use); otherwise the cached model, built on first use when the build side is installed."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import ModelError
from .speaker_model import (
    EMBEDDING,
    EMBEDDING_SIZE,
    ENCODER_FILE,
    MEL_FILTERS_FILE,
    MELS,
    MODEL_ENV,
    N_MELS,
    PARTIAL_FRAMES,
    default_speaker_dir,
    verified_model_dir,
)

# Partials per ONNX Runtime call: the LSTM's buffers grow with it (about 75 MiB at 64, 41 at 32, 18 at 16), and 32
# runs as fast per partial as 64 (16: about 15 % slower).
BATCH = 32


def speaker_model_dir() -> Path:
    """The converted encoder's folder: ``$WHISPERANE_SPEAKER_MODEL``, else the cached one, converted now when it
    is missing or damaged (the run side's one import of the build side for speakers, made only then)."""
    override = os.environ.get(MODEL_ENV)
    if override:
        return verified_model_dir(override)
    try:
        return verified_model_dir(default_speaker_dir())
    except ModelError:
        pass
    try:
        from ..convert.speaker import build_speaker_encoder
    except ImportError as err:
        raise ModelError(
            f"the speaker encoder is not converted yet and the build side is not installed ({err.name} missing): "
            f"run `whisperane convert resemblyzer` where torch is installed, or set {MODEL_ENV}") from None
    return build_speaker_encoder()


MAX_THREADS = 4  # the LSTM over a batch of partials gains little from more


def default_threads() -> int:
    """``$WHISPERANE_THREADS`` or the cores, as a model's default, at most MAX_THREADS: diarization runs before the
    transcription, with the cores to itself."""
    return max(1, min(MAX_THREADS, int(os.environ.get("WHISPERANE_THREADS", "0")) or os.cpu_count() or 1))


class SpeakerEncoder:
    """Partials of 160 mel frames -> 256-d L2-normalised speaker embeddings. ``threads``: ONNX Runtime's intra-op
    threads (``default_threads()`` when None); they sleep between calls, so they never spin into the
    transcription's components."""

    def __init__(self, model_dir: str | os.PathLike | None = None, threads: int | None = None):
        folder = Path(model_dir) if model_dir is not None else speaker_model_dir()
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or default_threads())
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(folder / ENCODER_FILE), options,
                                                providers=["CPUExecutionProvider"])
            self.mel_filters = np.load(folder / MEL_FILTERS_FILE).astype(np.float32)
        except Exception as err:  # noqa: BLE001 - ONNX Runtime and numpy raise several unrelated types
            raise ModelError(f"{folder}: not a readable speaker encoder ({' '.join(str(err).split())[:200]})") from err
        if self.mel_filters.shape[0] != N_MELS:
            raise ModelError(f"{folder}: mel filters of shape {self.mel_filters.shape}, expected {N_MELS} rows")

    def embed(self, mels: np.ndarray) -> np.ndarray:
        """Embeddings [n, 256] of partials ``mels`` [n, 160, 40], in calls of at most BATCH."""
        mels = np.asarray(mels, dtype=np.float32)
        if mels.ndim != 3 or mels.shape[1:] != (PARTIAL_FRAMES, N_MELS):
            raise ValueError(f"partials must be [n, {PARTIAL_FRAMES}, {N_MELS}], got {mels.shape}")
        out = [self.session.run([EMBEDDING], {MELS: mels[i : i + BATCH]})[0] for i in range(0, len(mels), BATCH)]
        return np.concatenate(out) if out else np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)


@lru_cache(maxsize=1)
def default_encoder() -> SpeakerEncoder:
    """The process-wide encoder on the cached model."""
    return SpeakerEncoder()
