"""Voice activity detection: Silero VAD through ONNX Runtime (no torch), faster-whisper's rules on top.

The model is Silero VAD v6.0 in its sequence form (MIT; ``silero_vad_v6.onnx`` from the ``faster-whisper``
wheel on PyPI, the model of silero-vad 6.0.0; silero-vad 6.2.3's ``silero_vad_16k_sequence.onnx`` is the
alternative ``"v6.2.3"``). One call scores many 32 ms windows (rows of 512 samples plus the 64 before them)
and returns the LSTM state, which is carried into the next call, so a long file is scored block by block
over :class:`whisperane.audio.AudioStream` in bounded memory (only the probabilities, 4 bytes per 32 ms, are
kept). The wheel is fetched at first use with
``pip download --no-deps``, the model checked against its sha256 and cached under the user cache; offline,
``$WHISPERANE_VAD_MODEL`` names a copy of the file.

:func:`get_speech_timestamps` follows faster-whisper's ``get_speech_timestamps`` (same options, defaults and
state machine) and :class:`SpeechTimestampsMap` puts times measured on speech-only audio back on the original
audio. For the sequential loop with ``vad_filter``, :func:`speech_stream` presents only the speech
of an audio, read like an ``AudioStream`` in bounded memory, and :func:`restore_timestamps` puts the
transcript's times back on the original audio (faster-whisper's ``restore_speech_timestamps``).
"""

from __future__ import annotations

import bisect
import numbers
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .audio import CHUNK_LENGTH, SAMPLE_RATE, AudioSource, AudioStream, open_audio
from .bundle import hash_path
from .convert.sources import _last_error_line, default_cache_dir
from .errors import AudioError, ModelError, OptionsError
from .vad_graph import conv2d_variant


@dataclass(frozen=True)
class SileroModelFile:
    """A Silero model file inside a wheel on PyPI, with its sha256."""

    package: str
    version: str
    member: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


# The sequence models (many windows per call) score audio; the streaming ones (one window per call,
# silero-vad's own form) are the references they are tested against. v6.0 is the default: it is what
# faster-whisper ships (its silero_vad_v6.onnx, equal to silero-vad 6.0.0's model), and on music-like tones
# inserted between speech the 6.2.3 model marked 2 to 8 regions of tones alone as speech where v6.0
# marked none (tests/test_vad.py).
SILERO_MODELS = {
    "v6.0": SileroModelFile(
        "faster-whisper",
        "1.2.1",
        "faster_whisper/assets/silero_vad_v6.onnx",
        "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
    ),
    "v6.2.3": SileroModelFile(
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
    ),
    "v6.0-streaming": SileroModelFile(
        "silero-vad",
        "6.0.0",
        "silero_vad/data/silero_vad.onnx",
        "597d30b3ec076608d059477bb14cfeffdf951bf5cae370d38f65d33bbfe82004",
    ),
    "v6.2.3-streaming": SileroModelFile(
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
    ),
}
DEFAULT_MODEL = "v6.0"
MODEL_ENV = "WHISPERANE_VAD_MODEL"

WINDOW_SAMPLES = 512  # one speech probability per 32 ms at 16 kHz
CONTEXT_SAMPLES = 64  # each window is scored with the 64 samples before it
STATE_SHAPE = (1, 1, 128)  # the LSTM's h and c
# Windows per ONNX Runtime call (16.4 s of audio): measured fastest on this CPU among 32..10000.
WINDOWS_PER_CALL = 512
# faster-whisper's rule: a region that reaches max_speech_duration_s is cut at a silence of at least this.
MIN_SILENCE_AT_MAX_SPEECH_MS = 98


# --------------------------------------------------------------------------------------------------
# options and results


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's ``VadOptions``: names, defaults and meaning.

    threshold: a window whose speech probability is at least this is speech.
    neg_threshold: while in speech, a window below this is silence (None: ``max(threshold - 0.15, 0.01)``).
    min_speech_duration_ms: speech regions shorter than this are dropped.
    max_speech_duration_s: longer regions are cut at the last silence of at least 98 ms, else hard.
    min_silence_duration_ms: silence shorter than this does not end a region.
    speech_pad_ms: regions are widened by this on each side (half the gap when two are closer).
    """

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def __post_init__(self) -> None:
        for name in ("threshold", "neg_threshold", "min_speech_duration_ms", "max_speech_duration_s",
                     "min_silence_duration_ms", "speech_pad_ms"):  # fmt: skip
            value = getattr(self, name)
            if value is None and name == "neg_threshold":
                continue
            # bool is an int to Python, and a string or NaN would fail later with a traceback or silently.
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
                raise OptionsError(f"VAD {name} must be a number, got {value!r}")
        if not 0.0 < self.threshold <= 1.0:
            raise OptionsError(f"VAD threshold must be in (0, 1], got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 <= self.neg_threshold <= self.threshold:
            raise OptionsError(f"VAD neg_threshold must be in [0, threshold], got {self.neg_threshold}")
        if not self.max_speech_duration_s > 0:
            raise OptionsError(f"VAD max_speech_duration_s must be > 0, got {self.max_speech_duration_s}")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise OptionsError(f"VAD {name} must be a finite number >= 0, got {getattr(self, name)}")

    @property
    def silence_threshold(self) -> float:
        """The neg_threshold in effect."""
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


@dataclass(frozen=True, order=True)
class SpeechRegion:
    """Speech in ``[start, end)``, in samples of the original 16 kHz audio."""

    start: int
    end: int

    @property
    def n_samples(self) -> int:
        return self.end - self.start

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


# --------------------------------------------------------------------------------------------------
# the model file: fetched from PyPI once, sha256 checked, cached


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
    if not (path.is_file() and hash_path(path) == model.sha256):
        _fetch_model(model, path)
    return path


def _fetch_model(model: SileroModelFile, path: Path) -> None:
    """Download the wheel, check the member's sha256 and move it to ``path`` with an atomic rename (a
    concurrent reader sees the whole file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as work:
        wheel = _pip_download(model, Path(work), path)
        staged = Path(work) / path.name
        try:
            with zipfile.ZipFile(wheel) as archive:
                staged.write_bytes(archive.read(model.member))
        except (zipfile.BadZipFile, KeyError) as err:
            raise ModelError(f"{wheel.name}: not the expected {model.requirement} wheel ({err})") from err
        actual = hash_path(staged)
        if actual != model.sha256:
            raise ModelError(
                f"{wheel.name}: {model.member} has sha256 {actual}, expected {model.sha256}; "
                f"set {MODEL_ENV} to a trusted copy of the model"
            )
        os.replace(staged, path)


def _pip_download(model: SileroModelFile, dest: Path, path: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--retries", "1", "--timeout", "15",
        model.requirement,
    ]  # fmt: skip
    how_to_provide = (
        f"set {MODEL_ENV} to a copy of {model.member} (in the {model.requirement} wheel) or put it at {path}"
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        raise ModelError(
            f"Silero VAD model: cannot run pip to download {model.requirement} ({err}); {how_to_provide}"
        ) from err
    if result.returncode != 0:
        raise ModelError(
            f"Silero VAD model: pip could not download {model.requirement}: {_last_error_line(result)}; "
            f"{how_to_provide}"
        )
    wheels = sorted(dest.glob(model.package.replace("-", "_") + "-*.whl"))
    if not wheels:
        raise ModelError(f"Silero VAD model: pip left no {model.requirement} wheel; {how_to_provide}")
    return wheels[0]


@lru_cache(maxsize=4)
def _session(path: str, threads: int) -> ort.InferenceSession:
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


# --------------------------------------------------------------------------------------------------
# scoring


@dataclass
class SileroVad:
    """Silero VAD over ONNX Runtime: speech probabilities of 32 ms windows, many windows per call.

    ``threads`` is ONNX Runtime's intra-op thread count: the model is small and its LSTM sequential, and
    one thread measured fastest here (two were slower on a loaded 2-core machine).
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
            self._session = _session(str(rewritten), int(self.threads))
        except ModelError:
            if rewritten == path:
                raise
            rewritten.unlink(missing_ok=True)  # a damaged cached rewrite: the published graph, rewritten next time
            self._session = _session(str(path), int(self.threads))

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


# --------------------------------------------------------------------------------------------------
# speech regions (faster-whisper's get_speech_timestamps)


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


# Where the VAD hears voice itself, for a check that speech produced words (the seek guard): no padding, and a
# pause of 100 ms ends a region (the defaults' 2 s pauses and 400 ms pads count a sentence break as speech).
VOICED = VadOptions(min_silence_duration_ms=100, speech_pad_ms=0)


@lru_cache(maxsize=1)
def default_vad() -> SileroVad:
    """The process-wide :class:`SileroVad` on the cached sequence model."""
    return SileroVad()


def speech_regions(
    probabilities: np.ndarray, n_samples: int, options: VadOptions | None = None
) -> list[SpeechRegion]:
    """faster-whisper's state machine over window probabilities, then its padding."""
    options = options or VadOptions()
    detector = _RegionDetector(options)
    for index, probability in enumerate(np.asarray(probabilities, dtype=np.float64).tolist()):
        detector.step(index * WINDOW_SAMPLES, probability)
    raw = detector.finish(n_samples)
    return _pad_regions(raw, n_samples, SAMPLE_RATE * options.speech_pad_ms / 1000)


class _RegionDetector:
    """The hysteresis state machine of faster-whisper's ``get_speech_timestamps`` (silero-vad's), one window
    at a time. Sample positions are window starts; ``regions`` collects [start, end] before padding."""

    def __init__(self, options: VadOptions):
        pad = SAMPLE_RATE * options.speech_pad_ms / 1000
        self.threshold = options.threshold
        self.silence_threshold = options.silence_threshold
        self.min_speech = SAMPLE_RATE * options.min_speech_duration_ms / 1000
        self.max_speech = SAMPLE_RATE * options.max_speech_duration_s - WINDOW_SAMPLES - 2 * pad
        self.min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
        self.min_silence_at_max = SAMPLE_RATE * MIN_SILENCE_AT_MAX_SPEECH_MS / 1000
        self.regions: list[list[int]] = []
        self.triggered = False
        self.start = 0
        self.temp_end = 0  # where the current silence began (0: none)
        self.prev_end = 0  # the last silence long enough to cut at when the region gets too long
        self.next_start = 0  # where speech resumed after prev_end

    def step(self, sample: int, probability: float) -> None:
        if probability >= self.threshold and self.temp_end:
            self.temp_end = 0
            if self.next_start < self.prev_end:
                self.next_start = sample
        if probability >= self.threshold and not self.triggered:
            self.triggered, self.start = True, sample
            return
        if self.triggered and sample - self.start > self.max_speech:
            if not self._cut_long_region(sample):
                return
        if probability < self.silence_threshold and self.triggered:
            if not self.temp_end:
                self.temp_end = sample
            if sample - self.temp_end > self.min_silence_at_max:
                self.prev_end = self.temp_end
            if sample - self.temp_end >= self.min_silence:
                if self.temp_end - self.start > self.min_speech:
                    self.regions.append([self.start, self.temp_end])
                self.prev_end = self.next_start = self.temp_end = 0
                self.triggered = False

    def _cut_long_region(self, sample: int) -> bool:
        """End a region that reached max_speech; False when faster-whisper skips the rest of the window."""
        if self.prev_end:
            self.regions.append([self.start, self.prev_end])
            # Speech that resumed after that silence continues as a new region.
            if self.next_start < self.prev_end:
                self.triggered = False
            else:
                self.start = self.next_start
            self.prev_end = self.next_start = self.temp_end = 0
            return True
        self.regions.append([self.start, sample])
        self.prev_end = self.next_start = self.temp_end = 0
        self.triggered = False
        return False

    def finish(self, n_samples: int) -> list[list[int]]:
        if self.triggered and n_samples - self.start > self.min_speech:
            self.regions.append([self.start, n_samples])
        return self.regions


def _pad_regions(raw: list[list[int]], n_samples: int, pad: float) -> list[SpeechRegion]:
    """Widen each region by ``pad`` samples, or by half the gap when the next region is closer than 2 pads."""
    for i, region in enumerate(raw):
        if i == 0:
            region[0] = int(max(0, region[0] - pad))
        if i == len(raw) - 1:
            region[1] = int(min(n_samples, region[1] + pad))
            continue
        following = raw[i + 1]
        gap = following[0] - region[1]
        if gap < 2 * pad:
            region[1] += int(gap // 2)
            following[0] = int(max(0, following[0] - gap // 2))
        else:
            region[1] = int(min(n_samples, region[1] + pad))
            following[0] = int(max(0, following[0] - pad))
    return [SpeechRegion(int(start), int(end)) for start, end in raw]


# --------------------------------------------------------------------------------------------------
# speech-only time <-> original time, chunks of at most 30 s


class SpeechTimestampsMap:
    """Times on the speech-only audio (the regions one after another) <-> times on the original audio.

    faster-whisper's ``SpeechTimestampsMap``, without its rounding to 10 ms, plus the inverse mapping.
    """

    def __init__(self, regions: Sequence[SpeechRegion], sample_rate: int = SAMPLE_RATE):
        if not regions:
            raise ValueError("a timestamps map needs at least one speech region")
        self.regions = tuple(regions)
        self.sample_rate = sample_rate
        self._filtered_ends: list[int] = []  # each region's end on the speech-only audio
        self._removed_before: list[int] = []  # samples removed before each region
        filtered = removed = previous_end = 0
        for region in self.regions:
            if region.start < previous_end or region.end <= region.start:
                raise ValueError(f"speech regions must be non-empty, ordered and disjoint: {region}")
            removed += region.start - previous_end
            filtered += region.n_samples
            previous_end = region.end
            self._filtered_ends.append(filtered)
            self._removed_before.append(removed)

    @property
    def n_samples(self) -> int:
        """Length of the speech-only audio."""
        return self._filtered_ends[-1]

    def region_index(self, time: float, is_end: bool = False) -> int:
        """The region a speech-only time falls in; a time on a boundary belongs to the next region unless it
        is an end time."""
        sample = round(time * self.sample_rate)
        if is_end:
            index = bisect.bisect_left(self._filtered_ends, sample)
        else:
            index = bisect.bisect_right(self._filtered_ends, sample)
        return min(index, len(self._filtered_ends) - 1)

    def original_time(self, time: float, region_index: int | None = None, is_end: bool = False) -> float:
        """The original-audio time of a speech-only ``time`` (``region_index`` forces the region, as
        faster-whisper does to keep a word's start and end in one region)."""
        if region_index is None:
            region_index = self.region_index(time, is_end)
        return time + self._removed_before[region_index] / self.sample_rate

    def speech_time(self, original_time: float) -> float:
        """The speech-only time of an original-audio time (one in removed audio goes to the next region's
        start, one after the last region to the end)."""
        sample = round(original_time * self.sample_rate)
        index = bisect.bisect_right([r.end for r in self.regions], sample)
        if index == len(self.regions):
            return self.n_samples / self.sample_rate
        region = self.regions[index]
        return (max(sample, region.start) - self._removed_before[index]) / self.sample_rate


# --------------------------------------------------------------------------------------------------
# the speech-only audio as a stream (sequential transcription with vad_filter)


class SpeechStream:
    """The speech regions of one audio, one after another, read like an :class:`AudioStream`.

    ``read(start, n)`` returns samples of the speech-only timeline, fetched region by region from the
    underlying reader (a read may span several regions, and the audio between them is never returned).
    As on a file stream, reads must have non-decreasing ``start`` and may reach back ``history_seconds``
    before the end of the previous read (the pattern of Whisper's seek loop); only that history is kept, so
    memory does not grow with the length of the audio. :attr:`time_map` puts speech-only times back on the
    original audio (:func:`restore_timestamps`).

    An audio without speech gives ``n_samples == 0`` and ``time_map is None``: the transcript is empty,
    which is not an error.
    """

    def __init__(
        self,
        reader: AudioStream,
        regions: Sequence[SpeechRegion],
        original_n_samples: int,
        probabilities: np.ndarray | None = None,
        *,
        history_seconds: float = CHUNK_LENGTH,
    ):
        self._reader = reader
        self.name = reader.name
        self.sample_rate = reader.sample_rate
        self.regions = tuple(regions)
        self.original_n_samples = int(original_n_samples)
        if self.regions and self.regions[-1].end > self.original_n_samples:
            raise ValueError(f"{self.name}: a speech region ends after the audio: {self.regions[-1]}")
        self.time_map = SpeechTimestampsMap(self.regions, self.sample_rate) if self.regions else None
        # Each region's first sample on the speech-only timeline (the map checks order and disjointness).
        self._region_offsets = np.cumsum([0] + [r.n_samples for r in self.regions]).tolist()
        self._history = int(history_seconds * self.sample_rate)
        self._buf = np.zeros(0, dtype=np.float32)
        self._buf_start = 0  # speech-only index of self._buf[0]
        self._keep_from = 0  # reads may not start before this index
        # The VAD's window probabilities over the original audio, when known: other region rules (vad.VOICED for
        # the seek guard) are derived from them without a second VAD pass.
        self.probabilities = np.zeros(0, dtype=np.float32) if probabilities is None else probabilities

    @property
    def n_samples(self) -> int:
        """Length of the speech-only audio (exact: the VAD pass read the whole source)."""
        return self._region_offsets[-1]

    @property
    def exhausted(self) -> bool:
        """Always True: ``n_samples`` is exact from the start (what the seek loop asks this for)."""
        return True

    @property
    def duration(self) -> float:
        """Length of the speech-only audio in seconds."""
        return self.n_samples / self.sample_rate

    @property
    def original_duration(self) -> float:
        """Length of the original audio in seconds."""
        return self.original_n_samples / self.sample_rate

    def read(self, start_sample: int, n_samples: int) -> np.ndarray:
        """Speech-only samples ``[start_sample, start_sample + n_samples)``; shorter or empty past the end."""
        if start_sample < 0 or n_samples < 0:
            raise ValueError(f"negative start or length: read({start_sample}, {n_samples})")
        if start_sample < self._keep_from:
            raise ValueError(
                f"{self.name}: speech sample {start_sample} was already released (reads may reach back to "
                f"{self._keep_from})"
            )
        end = min(start_sample + n_samples, self.n_samples)
        start = min(start_sample, end)
        keep_from = max(self._keep_from, min(start, end - self._history))
        # The buffer becomes [buffer_start, end): what is kept of it, then what the reader has to give.
        buffer_start = max(self._buf_start, keep_from)
        fetch_from = max(self._buf_start + len(self._buf), buffer_start)
        kept = self._buf[buffer_start - self._buf_start :]
        if end > fetch_from:
            kept = np.concatenate([kept, *self._fetch(fetch_from, end)])
        self._buf, self._buf_start, self._keep_from = kept, buffer_start, keep_from
        return self._buf[start - self._buf_start : end - self._buf_start].copy()

    def regions_from(self, start_sample: int) -> list[SpeechRegion]:
        """The original audio's regions behind speech-only samples ``[start_sample, n_samples)``: the first
        cut where ``start_sample`` falls in it (what is left of a lane, for another loop to read)."""
        if start_sample >= self.n_samples:
            return []
        index = bisect.bisect_right(self._region_offsets, max(0, start_sample)) - 1
        first = self.regions[index]
        cut = SpeechRegion(first.start + max(0, start_sample) - self._region_offsets[index], first.end)
        return [cut, *self.regions[index + 1 :]]

    def _fetch(self, start: int, end: int) -> list[np.ndarray]:
        """Speech-only samples ``[start, end)`` from the reader, one piece per region they touch."""
        pieces = []
        index = bisect.bisect_right(self._region_offsets, start) - 1
        while start < end:
            region, offset = self.regions[index], self._region_offsets[index]
            length = min(end, self._region_offsets[index + 1]) - start
            piece = self._reader.read(region.start + start - offset, length)
            if len(piece) != length:  # the decoder gave fewer samples than when the VAD read them
                raise AudioError(f"{self.name}: the audio ended early on a second reading")
            pieces.append(piece)
            start += length
            index += 1
        return pieces

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> SpeechStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SpeechStream({self.name!r}, {len(self.regions)} regions, duration={self.duration:.2f}s "
            f"of {self.original_duration:.2f}s)"
        )


def speech_stream(
    source: AudioSource | AudioStream, vad_options: VadOptions | None = None, vad: SileroVad | None = None
) -> SpeechStream:
    """Run the VAD over the whole of ``source``, then present only its speech as a :class:`SpeechStream`.

    A file is read twice, forward each time: once for the VAD, then again region by region as the stream is
    read. Audio already in memory (an array, a file ffmpeg decoded, an array stream) is read in place.
    An :class:`AudioStream` must not have been read yet. No speech gives a stream of 0 samples (an empty
    transcript, not an error).
    """
    options = vad_options if vad_options is not None else VadOptions()
    if not isinstance(options, VadOptions):
        raise OptionsError(f"vad_options must be a VadOptions, got {type(options).__name__}")
    first = source if isinstance(source, AudioStream) else open_audio(source)
    try:
        probabilities, n_samples = (vad or default_vad()).speech_probabilities(first)
        regions = speech_regions(probabilities, n_samples, options)
        # A stream in memory (the whole signal, nothing ever released) is read again as it is.
        reader = first if first._in_memory else open_audio(first.name, sample_rate=first.sample_rate)
    except BaseException:
        if first is not source:
            first.close()
        raise
    if reader is not first and first is not source:
        first.close()
    return SpeechStream(reader, regions, n_samples, probabilities)


# Restored times are rounded to 1 ms: finer than the 20 ms of Whisper's timestamps, and rounding never
# reorders times, so it keeps them monotonic.
RESTORED_TIME_DECIMALS = 3


def restore_timestamps(segments: list[dict], time_map: SpeechTimestampsMap, voiced: np.ndarray | None = None) -> None:
    """Put segment and word times measured on the speech-only audio back on the original audio, in place.

    As faster-whisper's ``restore_speech_timestamps``, except for a word across the boundary of two regions:
    its start is mapped in the region it starts in and its end in the region it ends in (faster-whisper maps
    both in the region of the word's middle, which can put the start or the end in removed audio). With
    ``voiced`` (the VAD's windows at or above its threshold, over the original audio), such a word is then
    kept on the side of the removed audio where the VAD hears more of it: the earlier up to that region's end,
    or the later from its first voiced window (DTW can start the first word after a cut in the padding before
    it: tiny.en put one 3 ms into 3.7 s of inserted tones); a word that starts in a region's unvoiced head after
    removed audio starts at the region's first voiced window (``_start_after_cut``). A segment with words spans
    its first word's start to its last word's end; one without is mapped directly. The mapping never
    decreases, so times keep their order. ``seek`` stays on the speech-only timeline.
    """
    previous_end = 0.0  # the original end of the word before (a region's first word follows removed audio)
    for segment in segments:
        words = segment.get("words") or []
        for word in words:
            word["start"], word["end"] = _restored_span(word["start"], word["end"], time_map, voiced, previous_end)
            previous_end = word["end"]
        if words:
            segment["start"], segment["end"] = words[0]["start"], words[-1]["end"]
        else:
            segment["start"], segment["end"] = _restored_span(segment["start"], segment["end"], time_map)


def _restored_span(start: float, end: float, time_map: SpeechTimestampsMap, voiced: np.ndarray | None = None,
                   previous_end: float = 0.0) -> tuple[float, float]:  # fmt: skip
    """A start on a region boundary belongs to the next region and an end to the previous one; an empty span
    on a boundary would then end before it starts, so the end is kept at the start. ``previous_end``: the
    original end of the word before."""
    first, last = time_map.region_index(start), time_map.region_index(end, is_end=True)
    original_start = time_map.original_time(start, first)
    original_end = time_map.original_time(end, last, is_end=True)
    if voiced is not None and first < last:
        original_start, original_end = _one_side(original_start, original_end, time_map.regions[first],
                                                 time_map.regions[last], voiced)  # fmt: skip
    elif voiced is not None:
        original_start = _start_after_cut(original_start, original_end, time_map, first, voiced, previous_end)
    original_start = round(original_start, RESTORED_TIME_DECIMALS)
    original_end = round(original_end, RESTORED_TIME_DECIMALS)
    return original_start, max(original_start, original_end)


def _start_after_cut(start: float, end: float, time_map: SpeechTimestampsMap, index: int, voiced: np.ndarray,
                     previous_end: float) -> float:  # fmt: skip
    """The start of the first word of region ``index``, where audio was removed before the region, put on the
    region's first voiced window (its onset) in two cases. A start in the head before the onset, when the word
    reaches it: the head is padding taken from what the VAD called silence, and DTW on the speech-only timeline,
    with other speech just before it, can start the first word there (tiny.en, batched: 160 ms into inserted
    tones, 4 ms into silence, against the VAD's onsets 48 and 52 ms after the clips' starts). A start after the
    onset with voice all the way from the onset to it: nothing else is heard there, and DTW after the cut can
    start the word late (tiny.en: "Stuff" 0.40 s after the clip's first sound, 20 ms long, 0.17 s into the
    voice; the VAD's onset lags a fricative by ~0.2 s, so the move is never too early)."""
    region = time_map.regions[index]
    if region.start <= (time_map.regions[index - 1].end if index else 0) or previous_end > region.start_s:
        return start
    head_start = region.start // WINDOW_SAMPLES
    head = voiced[head_start : -(-region.end // WINDOW_SAMPLES)]
    if not head.any():
        return start
    onset_window = head_start + int(head.argmax())
    onset = onset_window * WINDOW_SAMPLES / SAMPLE_RATE
    if start < onset <= end:
        return onset
    voiced_through = voiced[onset_window : int(start * SAMPLE_RATE) // WINDOW_SAMPLES + 1]
    return onset if start > onset and voiced_through.all() else start


def _one_side(start: float, end: float, before: SpeechRegion, after: SpeechRegion,
              voiced: np.ndarray) -> tuple[float, float]:  # fmt: skip
    """A word from ``start`` in region ``before`` to ``end`` in the later region ``after``, kept on one side."""
    window = WINDOW_SAMPLES / SAMPLE_RATE
    head = voiced[int(start / window) : -(-before.end // WINDOW_SAMPLES)]
    tail = voiced[after.start // WINDOW_SAMPLES : int(end / window) + 1]
    if not tail.any():  # nothing to move it to
        return (start, min(end, before.end_s)) if head.any() else (start, end)
    if head.sum() >= tail.sum():  # where it sounds longer (the VAD's probability lags the voice)
        return start, min(end, before.end_s)
    onset = (after.start // WINDOW_SAMPLES + int(tail.argmax())) * window
    return max(after.start_s, min(onset, end)), end
