"""The speaker encoder on the build side: Resemblyzer's GE2E voice encoder (``resemblyzer/pretrained.pt`` from its
wheel on PyPI, sha256 checked) as a PyTorch module equal to Resemblyzer's ``VoiceEncoder.forward``, exported to
ONNX with the Slaney mel filters its features need (docs/DESIGN.md §9). Resemblyzer's own code (librosa, webrtcvad)
is never imported: only the checkpoint is taken from the wheel."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..diarize.speaker_model import (
    CHECKPOINT_FILE,
    EMBEDDING,
    EMBEDDING_SIZE,
    ENCODER_FILE,
    MANIFEST_FILE,
    MEL_FILTERS_FILE,
    MELS,
    MODEL_ENV,
    MODEL_FILES,
    N_MELS,
    PARTIAL_FRAMES,
    RESEMBLYZER,
    default_speaker_dir,
    verified_model_dir,
    write_manifest,
)
from ..errors import ConversionError, ModelError
from ..util import atomic_write, file_sha256, read_wheel_member
from .mel import mel_filters

OPSET = 17
HIDDEN_SIZE = 256
LAYERS = 3


class VoiceEncoder(nn.Module):
    """Resemblyzer's network: the last layer's final hidden state -> linear -> ReLU -> L2 normalisation."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, HIDDEN_SIZE, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN_SIZE, EMBEDDING_SIZE)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        raw = torch.relu(self.linear(hidden[-1]))
        return raw / torch.norm(raw, dim=1, keepdim=True)


def load_voice_encoder(checkpoint: str | Path) -> VoiceEncoder:
    """The module with the checkpoint's weights (its GE2E similarity scale and bias, training-only, left out)."""
    state = torch.load(str(checkpoint), map_location="cpu", weights_only=True)["model_state"]
    module = VoiceEncoder()
    wanted = module.state_dict().keys()
    missing = [name for name in wanted if name not in state]
    if missing:
        raise ConversionError(f"{checkpoint}: not Resemblyzer's voice encoder (missing {missing[:3]})")
    module.load_state_dict({name: state[name] for name in wanted})
    return module.eval()


def checkpoint_path(folder: Path | None = None) -> Path:
    """The sha256-checked ``pretrained.pt`` kept in the model folder, fetched from PyPI when missing."""
    folder = folder or default_speaker_dir()
    path = folder / CHECKPOINT_FILE
    if path.is_file() and file_sha256(path) == RESEMBLYZER.sha256:
        return path
    hint = f"set {MODEL_ENV} to a folder holding a converted speaker encoder"
    data = read_wheel_member(RESEMBLYZER, folder, "speaker encoder", hint)
    return atomic_write(path, lambda f: f.write(data))


def export_encoder(module: VoiceEncoder, path: Path) -> Path:
    """The module as ONNX: ``mels`` [batch, 160, 40] -> ``embedding`` [batch, 256], the batch dynamic."""
    example = torch.zeros(2, PARTIAL_FRAMES, N_MELS)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(path), input_names=[MELS], output_names=[EMBEDDING],
                          dynamic_axes={MELS: {0: "batch"}, EMBEDDING: {0: "batch"}}, opset_version=OPSET,
                          do_constant_folding=True, dynamo=False)
    return path


def build_speaker_encoder(folder: str | Path | None = None, force: bool = False,
                          progress: Callable[[str], None] | None = None) -> Path:
    """The converted encoder's folder (``default_speaker_dir()`` unless given), built when missing, damaged or
    ``force``d: the checkpoint fetched and checked, the ONNX model and the mel filters written, the manifest last
    (a reader sees a complete model or none)."""
    folder = Path(folder).expanduser() if folder is not None else default_speaker_dir()
    if not force:
        try:
            return verified_model_dir(folder)
        except ModelError:
            pass
    say = progress or (lambda message: None)
    say(f"speaker encoder: fetching {RESEMBLYZER.requirement} ({RESEMBLYZER.member})")
    checkpoint = checkpoint_path(folder)
    say("speaker encoder: exporting ONNX")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as work:
        export_encoder(load_voice_encoder(checkpoint), Path(work) / ENCODER_FILE)
        np.save(Path(work) / MEL_FILTERS_FILE, mel_filters(N_MELS))
        (folder / MANIFEST_FILE).unlink(missing_ok=True)
        for name in MODEL_FILES:
            shutil.move(str(Path(work) / name), str(folder / name))
    write_manifest(folder)
    return verified_model_dir(folder)
