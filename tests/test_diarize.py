"""Speaker labels (docs/DESIGN.md §12): the speaker encoder's conversion checked against its torch module on real
speech, then diarization of conversations built at test time from tests/data's clips of different speakers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA_DIR

from whisperane.audio import load_audio
from whisperane.diarize.features import mel_power
from whisperane.diarize.speaker_model import N_MELS, PARTIAL_FRAMES


def torch_or_skip():
    return pytest.importorskip("torch", reason="the build side (torch) is not installed: no reference module")


@pytest.fixture(scope="module")
def converted():
    """(torch module, ONNX encoder) from the same checkpoint; skipped where the wheel cannot be had."""
    torch_or_skip()
    from whisperane.convert.speaker import build_speaker_encoder, checkpoint_path, load_voice_encoder
    from whisperane.diarize.encoder import SpeakerEncoder
    from whisperane.errors import ModelError

    try:
        folder = build_speaker_encoder()
    except ModelError as err:
        pytest.skip(f"the Resemblyzer wheel cannot be fetched here: {err}")
    return load_voice_encoder(checkpoint_path(folder)), SpeakerEncoder(folder)


def partials(audio: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Non-overlapping 160-frame partials of an utterance's mel power frames."""
    mel = mel_power(audio, filters)
    n = len(mel) // PARTIAL_FRAMES
    return mel[: n * PARTIAL_FRAMES].reshape(n, PARTIAL_FRAMES, N_MELS)


def test_mel_matches_torch_stft(converted):
    """The numpy mel against torch's STFT (librosa's settings) through the build side's Slaney filters."""
    torch = torch_or_skip()
    from whisperane.convert.mel import mel_filters

    audio = load_audio(DATA_DIR / "jfk.flac")
    ours = mel_power(audio, converted[1].mel_filters)
    window = torch.hann_window(400, periodic=True, dtype=torch.float64)
    stft = torch.stft(torch.from_numpy(audio).double(), 400, 160, window=window, center=True, pad_mode="constant",
                      return_complex=True)
    reference = (torch.from_numpy(mel_filters(N_MELS)).double() @ stft.abs() ** 2).T.numpy()
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).max() <= 1e-5 * reference.max()


@pytest.mark.parametrize("clip", ["jfk.flac", "1089-134691-0001.flac", "LJ001-0002.flac"])
def test_onnx_encoder_matches_torch_module(converted, clip):
    """The conversion check: the ONNX component's embeddings against the torch module's on real speech."""
    torch = torch_or_skip()
    module, encoder = converted
    mels = partials(load_audio(DATA_DIR / clip) * 8, encoder.mel_filters)
    with torch.no_grad():
        reference = module(torch.from_numpy(mels)).numpy()
    ours = encoder.embed(mels)
    assert ours.shape == reference.shape == (len(mels), 256)
    assert np.abs(ours - reference).max() < 1e-4
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
