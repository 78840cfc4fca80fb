"""The speaker encoder's identity, shared by the build side (``convert/speaker.py``, which writes it) and the run
side (``diarize/encoder.py``, which reads it): the wheel that ships Resemblyzer's GE2E weights, their sha256, the
files of the converted model and its tensor names (docs/DESIGN.md §9). Imports nothing but whisperane's bottom
helpers, so both sides import it without a circle."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ModelError
from ..util import WheelMember, atomic_write, default_cache_dir, file_sha256

# Resemblyzer 0.1.4 (Apache-2.0): a 3-layer LSTM of 256 units over 40 mel channels, a linear layer to 256, ReLU,
# L2 normalisation (its voice_encoder.py).
RESEMBLYZER = WheelMember(
    "resemblyzer", "0.1.4", "resemblyzer/pretrained.pt",
    "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e",
)

# The encoder's input: Resemblyzer's hparams.py (25 ms windows, 10 ms hop, 40 mel channels at 16 kHz) and its
# partial utterances of 160 frames (1.6 s).
N_MELS = 40
N_FFT = 400
HOP_LENGTH = 160
PARTIAL_FRAMES = 160
EMBEDDING_SIZE = 256
NORM_TARGET_DBFS = -30.0  # audio_norm_target_dBFS: each partial's speech is brought to this level (increase only)

# Files of a converted model, in its folder.
ENCODER_FILE = "VoiceEncoder.onnx"
MEL_FILTERS_FILE = "mel_filters.npy"  # [N_MELS, N_FFT // 2 + 1] float32, librosa's Slaney filters
MANIFEST_FILE = "manifest.json"
CHECKPOINT_FILE = "pretrained.pt"  # the source, kept beside the model for conversion checks (tests/test_diarize.py)
MODEL_FILES = (ENCODER_FILE, MEL_FILTERS_FILE)
# Tensor names.
MELS = "mels"  # float32 [batch, PARTIAL_FRAMES, N_MELS]: mel power spectrogram frames
EMBEDDING = "embedding"  # float32 [batch, EMBEDDING_SIZE]: L2-normalised

MODEL_ENV = "WHISPERANE_SPEAKER_MODEL"  # a folder holding a converted model (offline use)


def default_speaker_dir() -> Path:
    """Where the converted encoder is cached: ``<cache>/speaker/resemblyzer-0.1.4``."""
    return default_cache_dir() / "speaker" / f"{RESEMBLYZER.package}-{RESEMBLYZER.version}"


def write_manifest(folder: Path) -> None:
    """Record the source checkpoint's sha256 and each model file's, as the last step of a conversion."""
    manifest = {"source": RESEMBLYZER.requirement, "source_sha256": RESEMBLYZER.sha256,
                "files": {name: file_sha256(folder / name) for name in MODEL_FILES}}
    data = (json.dumps(manifest, indent=1) + "\n").encode()
    atomic_write(folder / MANIFEST_FILE, lambda f: f.write(data))


def verified_model_dir(folder: str | os.PathLike) -> Path:
    """``folder`` when its manifest names the expected source and every file matches its sha256; else a
    ModelError saying what is wrong."""
    folder = Path(folder).expanduser()
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, ValueError) as err:
        raise ModelError(f"{folder}: no readable speaker encoder manifest ({err})") from None
    if manifest.get("source_sha256") != RESEMBLYZER.sha256:
        raise ModelError(f"{folder}: the speaker encoder was converted from another checkpoint")
    for name in MODEL_FILES:
        path = folder / name
        if not path.is_file() or file_sha256(path) != manifest.get("files", {}).get(name):
            raise ModelError(f"{path}: missing or not the file the conversion wrote (sha256 differs)")
    return folder
