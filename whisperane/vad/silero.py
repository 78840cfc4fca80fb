"""Silero VAD through ONNX Runtime (no torch): the model file (fetched from PyPI once, sha256 checked, cached)
and its speech probabilities of 32 ms windows, scored block by block over an audio stream."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..audio import AudioSource, AudioStream, open_audio
from ..errors import ModelError, OptionsError
from ..util import WheelMember, atomic_write, default_cache_dir, file_sha256, read_wheel_member
from .graph import conv2d_variant
from .regions import WINDOW_SAMPLES, SpeechRegion, VadOptions, speech_regions

# The sequence models (many windows per call) score audio; the streaming ones (one window per call,
# silero-vad's own form) are the references they are tested against. v6.0 is the default: it is what
# faster-whisper ships (its silero_vad_v6.onnx, equal to silero-vad 6.0.0's model), and on music-like tones
# inserted between speech (tests/test_vad.py's gapped audio) the 6.2.3 model marks regions of tones alone as
# speech where v6.0 marks none.
SILERO_MODELS = {
    "v6.0": WheelMember(
        "faster-whisper",
        "1.2.1",
        "faster_whisper/assets/silero_vad_v6.onnx",
        "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
    ),
    "v6.2.3": WheelMember(
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
    ),
    "v6.0-streaming": WheelMember(
        "silero-vad",
        "6.0.0",
        "silero_vad/data/silero_vad.onnx",
        "597d30b3ec076608d059477bb14cfeffdf951bf5cae370d38f65d33bbfe82004",
    ),
    "v6.2.3-streaming": WheelMember(
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
    ),
}


DEFAULT_MODEL = "v6.0"


MODEL_ENV = "WHISPERANE_VAD_MODEL"


CONTEXT_SAMPLES = 64  # each window is scored with the 64 samples before it


STATE_SHAPE = (1, 1, 128)  # the LSTM's h and c


# Windows per ONNX Runtime call (16.4 s of audio): chosen for speed; smaller and larger calls both score slower.
WINDOWS_PER_CALL = 512


def default_vad_dir() -> Path:
    """Where the model files are cached: ``$WHISPERANE_CACHE/vad`` or ``~/.cache/whisperane/vad``."""
    return default_cache_dir() / "vad"


def silero_model_path(name: str = DEFAULT_MODEL, *, cache_dir: Path | None = None) -> Path:
    """A Silero model file (a key of ``SILERO_MODELS``): for the default model ``$WHISPERANE_VAD_MODEL``
    when set, else the cached copy, fetched from PyPI first when it is missing or does not match its sha256."""
    if name not in SILERO_MODELS:
        raise OptionsError(f"unknown Silero model {name!r} (expected one of {sorted(SILERO_MODELS)})")
    override = os.environ.get(MODEL_ENV)
    if name == DEFAULT_MODEL and override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelError(f"{MODEL_ENV}={override}: no such file (expected a Silero sequence model .onnx)")
        return path
    model = SILERO_MODELS[name]
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_vad_dir()
    path = folder / f"{model.package}-{model.version}" / Path(model.member).name
    if not (path.is_file() and file_sha256(path) == model.sha256):
        _fetch_model(model, path)
    return path


def _fetch_model(model: WheelMember, path: Path) -> None:
    """Download the wheel, check the member's sha256 and write it to ``path`` atomically (a concurrent reader
    sees the whole file or none)."""
    hint = f"set {MODEL_ENV} to a trusted copy of {model.member} (in the {model.requirement} wheel) or put it at {path}"
    data = read_wheel_member(model, path.parent, "Silero VAD model", hint)
    atomic_write(path, lambda f: f.write(data))


@lru_cache(maxsize=4)
def onnx_session(path: str, threads: int) -> ort.InferenceSession:
    """One ONNX Runtime session per model file and thread count (sessions are safe to share by threads)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ONNX Runtime raises several unrelated types
        raise ModelError(f"{path}: not a readable ONNX model ({' '.join(str(err).split())[:200]})") from err
    names = {i.name for i in session.get_inputs()}
    if names != {"input", "h", "c"}:
        raise ModelError(
            f"{path}: not the Silero sequence model (inputs {sorted(names)}, expected input, h, c)"
        )
    return session


@dataclass
class SileroVad:
    """Silero VAD over ONNX Runtime: speech probabilities of 32 ms windows, many windows per call.

    ``threads`` is ONNX Runtime's intra-op thread count: the model is small and its LSTM sequential, so one
    thread is the default (more contend for the cores without speeding the call).
    """

    model_path: str | os.PathLike | None = None  # None: the model named ``model``, fetched and cached
    model: str = DEFAULT_MODEL
    threads: int = 1
    windows_per_call: int = WINDOWS_PER_CALL
    _session: ort.InferenceSession = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.windows_per_call < 1:
            raise OptionsError(f"windows_per_call must be at least 1, got {self.windows_per_call}")
        path = Path(self.model_path) if self.model_path is not None else silero_model_path(self.model)
        rewritten = conv2d_variant(path, default_vad_dir() / "conv2d")
        try:
            self._session = onnx_session(str(rewritten), int(self.threads))
        except ModelError:
            if rewritten == path:
                raise
            rewritten.unlink(missing_ok=True)  # a damaged cached rewrite: the published graph, rewritten next time
            self._session = onnx_session(str(path), int(self.threads))

    def speech_probabilities(self, audio: AudioSource | AudioStream) -> tuple[np.ndarray, int]:
        """Speech probability of each 32 ms window (float32) and the number of samples scored.

        A path is opened and read as a stream; an :class:`AudioStream` is read from its first sample.
        """
        if isinstance(audio, AudioStream):
            return self._score_stream(audio)
        with open_audio(audio) as stream:
            return self._score_stream(stream)

    def _score_stream(self, stream: AudioStream) -> tuple[np.ndarray, int]:
        block_samples = self.windows_per_call * WINDOW_SAMPLES
        h = np.zeros(STATE_SHAPE, dtype=np.float32)
        c = np.zeros(STATE_SHAPE, dtype=np.float32)
        context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        probabilities: list[np.ndarray] = []
        n_samples = 0
        while True:
            block = stream.read(n_samples, block_samples)
            if block.size == 0:
                break
            n_samples += block.size
            rows, context = _window_rows(block, context)
            probs, h, c = self._session.run(None, {"input": rows, "h": h, "c": c})
            probabilities.append(np.asarray(probs, dtype=np.float32).reshape(-1))
            if block.size < block_samples:  # a short read is the end of the audio
                break
        scores = np.concatenate(probabilities) if probabilities else np.zeros(0, dtype=np.float32)
        return scores, n_samples


def _window_rows(block: np.ndarray, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of [64 samples of context | 512 samples] for ``block`` (its last window zero-padded), and the
    context for the next block."""
    n_windows = -(-block.size // WINDOW_SAMPLES)
    frames = np.zeros((n_windows, WINDOW_SAMPLES), dtype=np.float32)
    frames.reshape(-1)[: block.size] = block
    rows = np.empty((n_windows, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32)
    rows[:, CONTEXT_SAMPLES:] = frames
    rows[0, :CONTEXT_SAMPLES] = context
    rows[1:, :CONTEXT_SAMPLES] = frames[:-1, -CONTEXT_SAMPLES:]
    return rows, frames[-1, -CONTEXT_SAMPLES:].copy()


@lru_cache(maxsize=1)
def default_vad() -> SileroVad:
    """The process-wide :class:`SileroVad` on the cached sequence model."""
    return SileroVad()


def get_speech_timestamps(
    audio: AudioSource | AudioStream,
    options: VadOptions | None = None,
    *,
    vad: SileroVad | None = None,
    **option_values,
) -> list[SpeechRegion]:
    """Speech regions of ``audio`` (a path, a 16 kHz array or a stream read from its start), in samples.

    Options come as a :class:`VadOptions` or as its fields by name, as faster-whisper takes them.
    """
    if options is None:
        options = VadOptions(**option_values)
    elif option_values:
        raise TypeError("pass either a VadOptions or option values, not both")
    probabilities, n_samples = (vad or default_vad()).speech_probabilities(audio)
    return speech_regions(probabilities, n_samples, options)
