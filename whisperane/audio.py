"""Audio input: decode, downmix and resample to 16 kHz mono float32; stream long files; the mel filters.

Files go through soundfile (libsndfile: wav, flac, ogg/opus, mp3, aiff, ...) and soxr; other containers
(m4a, mp4, webm, ...) go through ffmpeg when it is on PATH. Long files are read as a stream
(:class:`AudioStream`) so that a two-hour recording never sits in memory whole.

``mel_filters`` is the one filter bank every log-mel implementation (the exported MelSpectrogram
component, and the tests' numpy reference in tests/reference.py) uses.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from .errors import AudioError

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30-second window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a window
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the encoder's conv stem halves the frame rate
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 mel frames per second
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 50 encoder frames per second
INPUT_STRIDE = N_SAMPLES_PER_TOKEN // HOP_LENGTH  # 2 mel frames per encoder frame (and per timestamp token)
TIME_PRECISION = N_SAMPLES_PER_TOKEN / SAMPLE_RATE  # 0.02 s: one encoder frame, one timestamp token

RESAMPLE_QUALITY = "HQ"

# Extensions libsndfile decodes itself; a file with one of these that it cannot open is broken, not exotic.
_SOUNDFILE_EXTENSIONS = {fmt.lower() for fmt in sf.available_formats()} | {
    "wave",
    "oga",
    "opus",
    "aif",
    "aifc",
    "snd",
    "sf",
    "mpeg",
}

AudioSource = str | os.PathLike | np.ndarray
# what `whisperane transcribe DIR` and `whisperane batch DIR` take for audio
AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".mp4", ".aac", ".webm", ".wma", ".aiff", ".aif", ".mkv", ".mov"}


# --------------------------------------------------------------------------------------------------
# arrays



def _to_mono_float32(audio: np.ndarray, name: str) -> np.ndarray:
    """Validate an in-memory signal and return it as 1-D float32 (integers scaled to [-1, 1))."""
    a = np.asarray(audio)
    if a.ndim == 2:
        # Audio never has more channels than samples: a wide array is (channels, samples).
        if a.shape[1] > a.shape[0]:
            a = a.T
        a = a.mean(axis=1, dtype=np.float64) if a.shape[1] > 1 else a[:, 0]
    elif a.ndim != 1:
        raise AudioError(f"{name}: expected a 1-D or 2-D (samples, channels) array, got shape {a.shape}")

    if a.dtype.kind == "f":
        a = a.astype(np.float32, copy=False)
    elif a.dtype.kind == "i":
        a = (a.astype(np.float64) / float(2 ** (8 * a.dtype.itemsize - 1))).astype(np.float32)
    elif a.dtype.kind == "u":
        half = float(2 ** (8 * a.dtype.itemsize - 1))
        a = ((a.astype(np.float64) - half) / half).astype(np.float32)
    else:
        raise AudioError(f"{name}: cannot use an array of dtype {a.dtype} as audio")

    if a.size == 0:
        raise AudioError(f"{name}: contains no audio samples")
    _check_finite(a, name, offset_seconds=0.0, rate=SAMPLE_RATE)
    return a


def _check_finite(block: np.ndarray, name: str, offset_seconds: float, rate: int) -> None:
    finite = np.isfinite(block)
    if not finite.all():
        first_bad = int(np.argmin(finite.reshape(len(block), -1).all(axis=1)))
        at = offset_seconds + first_bad / rate
        raise AudioError(f"{name}: contains NaN or infinite sample values (first at {at:.2f} s)")


def pad_or_trim(array: np.ndarray, length: int = N_SAMPLES, *, axis: int = -1) -> np.ndarray:
    """Zero-pad or trim ``array`` along ``axis`` to ``length`` samples, as the encoder expects."""
    if array.shape[axis] > length:
        array = array.take(indices=range(length), axis=axis)
    if array.shape[axis] < length:
        pad_widths = [(0, 0)] * array.ndim
        pad_widths[axis] = (0, length - array.shape[axis])
        array = np.pad(array, pad_widths)
    return array


# --------------------------------------------------------------------------------------------------
# files


def _check_path(path: str | os.PathLike) -> str:
    name = os.fspath(path)
    if not os.path.exists(name):
        raise AudioError(f"{name}: no such file")
    if os.path.isdir(name):
        raise AudioError(f"{name}: is a directory, not an audio file")
    try:
        with open(name, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise AudioError(f"{name}: cannot open: {e.strerror or e}") from e
    if not head:
        raise AudioError(f"{name}: empty file (0 bytes)")
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        _check_wav_not_truncated(name)
    return name


def _check_wav_not_truncated(name: str) -> None:
    """Reject a RIFF/WAVE file whose data chunk declares more bytes than the file holds.

    libsndfile silently shortens such files to what is there; a cut-off recording would then be
    transcribed as if it were complete. Sizes 0 and 0xFFFFFFFF are placeholders written by recorders
    that never finalised the header: those are read as far as the data goes.
    """
    size = os.path.getsize(name)
    with open(name, "rb") as f:
        pos = 12
        while pos + 8 <= size:
            f.seek(pos)
            chunk_id, chunk_size = struct.unpack("<4sI", f.read(8))
            if chunk_id == b"data":
                available = size - pos - 8
                if chunk_size not in (0, 0xFFFFFFFF) and chunk_size > available:
                    raise AudioError(
                        f"{name}: truncated WAV file: the header declares {chunk_size} bytes of audio "
                        f"but only {available} are present"
                    )
                return
            pos += 8 + chunk_size + (chunk_size & 1)


def _ffmpeg_decode(name: str, sample_rate: int) -> np.ndarray:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise AudioError(f"{name}: ffmpeg is not on PATH")
    cmd = [
        ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "0",
        "-i", name, "-f", "s16le", "-ac", "1", "-acodec", "pcm_s16le", "-ar", str(sample_rate), "-",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, check=False)
    except OSError as e:
        raise AudioError(f"{name}: could not run ffmpeg: {e}") from e
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        cause = lines[-1] if lines else f"exit status {proc.returncode}"
        raise AudioError(f"{name}: ffmpeg could not decode it: {cause}")
    pcm = np.frombuffer(proc.stdout[: len(proc.stdout) // 2 * 2], dtype="<i2")
    if pcm.size == 0:
        raise AudioError(f"{name}: contains no audio samples")
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def _open_soundfile(name: str) -> tuple[sf.SoundFile | None, str | None]:
    """Open with libsndfile; on failure return the reason instead of raising (ffmpeg may still cope)."""
    try:
        return sf.SoundFile(name), None
    except Exception as e:  # noqa: BLE001 - libsndfile raises LibsndfileError, RuntimeError, TypeError...
        return None, _one_line(e)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    # libsndfile repeats the file name ("Error opening 'x.wav': Format not recognised.")
    if ": " in text and text.startswith("Error opening"):
        text = text.split(": ", 1)[1]
    if text.startswith("Error : "):
        text = text[len("Error : ") :]
    # libsndfile's answer when libmpg123 finds no MPEG frame in a file it had already opened; the file is there.
    if text.startswith("File does not exist or is not a regular file"):
        text = "no valid audio frames found"
    return text.rstrip(".")


def _mp3_declares_length(name: str) -> bool:
    """True when an MP3 file carries a Xing/Info/VBRI header: its frame count is then the encoder's, and a
    file that decodes to much less has been cut off (without one, libsndfile estimates the length from the
    file size, which says nothing about truncation)."""
    try:
        with open(name, "rb") as f:
            head = f.read(10)
            if head[:3] == b"ID3" and len(head) == 10:  # skip an ID3v2 tag: 10-byte header, syncsafe size
                f.seek(10 + ((head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F)))
            else:
                f.seek(0)
            first_frame = f.read(2048)  # the tag sits right after the first frame's side information
    except OSError:
        return False
    return any(tag in first_frame for tag in (b"Xing", b"Info", b"VBRI"))


# --------------------------------------------------------------------------------------------------
# streaming


class AudioStream:
    """16 kHz mono float32 samples of one source, read window by window.

    A file is decoded forward in blocks and resampled incrementally, keeping only a bounded buffer:
    reads must have non-decreasing ``start`` and may reach back ``history_seconds`` before the end of
    the previous read (the seek pattern of Whisper's long-form loop). An in-memory array
    (:meth:`from_array`) allows any read.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        sample_rate: int = SAMPLE_RATE,
        block_seconds: float = 10.0,
        history_seconds: float = CHUNK_LENGTH,
    ):
        self.name = _check_path(path)
        self.sample_rate = sample_rate
        file, reason = _open_soundfile(self.name)
        if file is None:
            if shutil.which("ffmpeg") is not None:
                raise AudioError(
                    f"{self.name}: libsndfile cannot read it ({reason}); open_audio() decodes it with ffmpeg"
                )
            raise _undecodable(self.name, reason)
        self._init_file(file, block_seconds, history_seconds)

    @classmethod
    def _from_soundfile(cls, name: str, file: sf.SoundFile, sample_rate: int) -> AudioStream:
        self = cls.__new__(cls)
        self.name = name
        self.sample_rate = sample_rate
        self._init_file(file, block_seconds=10.0, history_seconds=CHUNK_LENGTH)
        return self

    def _init_file(self, file: sf.SoundFile, block_seconds: float, history_seconds: float) -> None:
        self._file: sf.SoundFile | None = file
        self.source_sample_rate = int(file.samplerate)
        if self.source_sample_rate <= 0:
            file.close()
            raise AudioError(f"{self.name}: invalid sample rate {self.source_sample_rate} Hz")
        if file.frames == 0:
            compressed = file.format not in ("WAV", "WAVEX", "AIFF", "RAW")
            file.close()
            cause = "no decodable audio (truncated or corrupt)" if compressed else "contains no audio samples"
            raise AudioError(f"{self.name}: {cause}")
        self._header_frames = int(file.frames)
        self._length_declared = file.format == "MP3" and _mp3_declares_length(self.name)
        self._block_frames = max(1, int(block_seconds * self.source_sample_rate))
        self._history = int(history_seconds * self.sample_rate)
        self._resampler = (
            soxr.ResampleStream(
                self.source_sample_rate, self.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY
            )
            if self.source_sample_rate != self.sample_rate
            else None
        )
        self._frames_read = 0
        self._exhausted = False
        self.in_memory = False
        self._buf = np.zeros(0, dtype=np.float32)
        self._buf_start = 0  # index (at sample_rate) of self._buf[0]
        self._keep_from = 0  # reads may not start before this index

    @classmethod
    def from_array(
        cls, audio: np.ndarray, *, name: str = "<array>", sample_rate: int = SAMPLE_RATE
    ) -> AudioStream:
        """Wrap samples already at ``sample_rate`` (2-D arrays are downmixed, integers scaled)."""
        self = cls.__new__(cls)
        self.name = name
        self.sample_rate = sample_rate
        self.source_sample_rate = sample_rate
        self._file = None
        self._resampler = None
        self._buf = _to_mono_float32(audio, name)
        self._buf_start = 0
        self._keep_from = 0
        self._exhausted = True
        self.in_memory = True
        self._header_frames = len(self._buf)
        self._frames_read = len(self._buf)
        return self

    # -- size ----------------------------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """True once the whole source has been decoded (``n_samples`` is then exact)."""
        return self._exhausted

    @property
    def n_samples(self) -> int:
        """Number of samples at ``sample_rate``: from the header until the end has been decoded, then exact
        (mp3 headers may be off a little)."""
        if self._exhausted:
            return self._buf_start + len(self._buf)
        return round(self._header_frames * self.sample_rate / self.source_sample_rate)

    @property
    def duration(self) -> float:
        """Length in seconds (see ``n_samples``)."""
        return self.n_samples / self.sample_rate

    # -- reading -------------------------------------------------------------------------------------

    def read(self, start_sample: int, n_samples: int) -> np.ndarray:
        """Samples ``[start_sample, start_sample + n_samples)``; shorter (or empty) past the end."""
        if start_sample < 0 or n_samples < 0:
            raise ValueError(f"negative start or length: read({start_sample}, {n_samples})")
        if start_sample < self._keep_from:
            raise ValueError(
                f"{self.name}: sample {start_sample} was already released by the stream (reads may reach "
                f"back to {self._keep_from}); use load_audio() for random access"
            )
        end = start_sample + n_samples
        if not self.in_memory:
            keep_from = max(self._keep_from, min(start_sample, end - self._history))
            self._decode_until(end, keep_from)
            self._keep_from = keep_from
        lo = start_sample - self._buf_start
        hi = end - self._buf_start
        return self._buf[lo:hi].copy()

    def read_all(self) -> np.ndarray:
        """Every sample from the start (only before the stream has released any)."""
        if self._keep_from > 0:
            raise ValueError(f"{self.name}: the stream has already released its beginning")
        if not self.in_memory:
            self._decode_until(None, 0)
        return self._buf.copy()

    def _decode_until(self, end: int | None, keep_from: int) -> None:
        """Decode forward until index ``end`` (None: to the end), releasing samples before ``keep_from``."""
        pieces = [self._buf]
        start = self._buf_start
        length = len(self._buf)
        while not self._exhausted and (end is None or start + length < end):
            chunk = self._decode_block()
            pieces.append(chunk)
            length += len(chunk)
            # On a forward skip, let go of what lies before keep_from as we go, so memory stays bounded.
            if start < keep_from and length > 4 * self._block_frames:
                joined = np.concatenate(pieces)
                cut = min(keep_from - start, len(joined))
                pieces, start, length = [joined[cut:]], start + cut, length - cut
        joined = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        cut = min(max(keep_from - start, 0), len(joined))
        self._buf = joined[cut:]
        self._buf_start = start + cut
        if self._exhausted and self._buf_start + len(self._buf) == 0:
            raise AudioError(f"{self.name}: contains no audio samples")

    def _decode_block(self) -> np.ndarray:
        assert self._file is not None
        at = self._frames_read / self.source_sample_rate
        try:
            block = self._file.read(self._block_frames, dtype="float32", always_2d=True)
        except Exception as e:  # noqa: BLE001 - libsndfile errors come in several types
            self.close()
            until = at + self._block_frames / self.source_sample_rate
            raise AudioError(
                f"{self.name}: corrupt or truncated audio "
                f"(decoding failed between {at:.1f} s and {until:.1f} s: {_one_line(e)})"
            ) from e
        if len(block):
            try:
                _check_finite(block, self.name, at, self.source_sample_rate)
            except AudioError:
                self.close()
                raise
        self._frames_read += len(block)
        mono = block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]
        last = len(block) == 0
        if last:
            self._exhausted = True
            self.close()
            self._check_complete()
        if self._resampler is None:
            return np.ascontiguousarray(mono, dtype=np.float32)
        return self._resampler.resample_chunk(np.ascontiguousarray(mono), last=last)

    def _check_complete(self) -> None:
        """An MP3 whose Xing/Info header counts more frames than decoded was cut off (libmpg123 only warns)."""
        missing = self._header_frames - self._frames_read
        if self._length_declared and missing > max(2 * 1152, 0.01 * self._header_frames):
            rate = self.source_sample_rate
            raise AudioError(
                f"{self.name}: truncated MP3 file: the header declares {self._header_frames / rate:.1f} s "
                f"of audio but only {self._frames_read / rate:.1f} s are present"
            )

    # -- lifetime ------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> AudioStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AudioStream({self.name!r}, duration={self.duration:.2f}s, source_rate={self.source_sample_rate})"


def open_audio(source: AudioSource, *, sample_rate: int = SAMPLE_RATE) -> AudioStream:
    """An :class:`AudioStream` for an array (in memory), a file libsndfile reads (streamed) or any other
    file ffmpeg decodes (decoded whole through a pipe)."""
    if isinstance(source, np.ndarray):
        if sample_rate != SAMPLE_RATE:
            source = soxr.resample(_to_mono_float32(source, "<array>"), SAMPLE_RATE, sample_rate)
        return AudioStream.from_array(source, sample_rate=sample_rate)
    if not isinstance(source, (str, os.PathLike)):
        raise AudioError(f"{source!r}: expected a file path or a numpy array")
    name = _check_path(source)
    file, reason = _open_soundfile(name)
    if file is not None:
        return AudioStream._from_soundfile(name, file, sample_rate)
    if shutil.which("ffmpeg") is not None:
        return AudioStream.from_array(_ffmpeg_decode(name, sample_rate), name=name, sample_rate=sample_rate)
    raise _undecodable(name, reason)


def _undecodable(name: str, reason: str | None) -> AudioError:
    """The error for a file libsndfile cannot read when there is no ffmpeg to fall back on."""
    ext = Path(name).suffix.lower().lstrip(".")
    if ext in _SOUNDFILE_EXTENSIONS:
        return AudioError(f"{name}: not a valid {ext.upper()} file or corrupt ({reason})")
    kind = f".{ext} files" if ext else "this format"
    return AudioError(
        f"{name}: ffmpeg is needed to decode {kind} (libsndfile: {reason}); "
        "install ffmpeg or convert the file to WAV/FLAC"
    )


def load_audio(source: AudioSource, sr: int = SAMPLE_RATE) -> np.ndarray:
    """The whole signal as float32 mono at ``sr`` Hz. Arrays are taken as 16 kHz (integers scaled)."""
    with open_audio(source, sample_rate=sr) as stream:
        return stream.read_all()
