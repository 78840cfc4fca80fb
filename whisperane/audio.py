"""Audio input: decode, downmix and resample to 16 kHz mono float32; stream long files; probe a file's length.

Files go through soundfile (libsndfile: wav, flac, ogg/opus, mp3, aiff, ...; see audio_files.py) and soxr;
other containers (m4a, mp4, webm, ...) through PyAV or the ffmpeg command (audio_decode.py). Every file is read
as a stream (:class:`AudioStream`) so that a two-hour recording never sits in memory whole. (The mel filters are
in whisperane.convert.mel.)
"""

from __future__ import annotations

import math
import os

import numpy as np
import soundfile as sf
import soxr

from .audio_decode import DecodedAudio, open_decoded
from .audio_files import (
    UNKNOWN_LENGTH,
    check_path,
    check_samples,
    count_frames,
    mp3_declares_length,
    open_soundfile,
    read_block,
)
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
    check_samples(a, name, offset_seconds=0.0, rate=SAMPLE_RATE)
    return a


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
# streaming


class AudioStream:
    """16 kHz mono float32 samples of one source, read window by window.

    A file is decoded forward in blocks and resampled incrementally, keeping only a bounded buffer:
    reads must have non-decreasing ``start`` and may reach back ``history_seconds`` before the end of
    the previous read (the seek pattern of Whisper's long-form loop). An in-memory array
    (:meth:`from_array`) allows any read.
    """

    def __init__(self, path: str | os.PathLike, *, sample_rate: int = SAMPLE_RATE, block_seconds: float = 10.0,
                 history_seconds: float = CHUNK_LENGTH):
        self.name = check_path(path)
        self.sample_rate = sample_rate
        self._init_file(_open_file(self.name, sample_rate), block_seconds, history_seconds)

    def _init_file(self, file: sf.SoundFile | DecodedAudio, block_seconds: float, history_seconds: float) -> None:
        self._file: sf.SoundFile | DecodedAudio | None = file
        self.source_sample_rate = int(file.samplerate)
        if self.source_sample_rate <= 0:
            file.close()
            raise AudioError(f"{self.name}: invalid sample rate {self.source_sample_rate} Hz")
        if file.frames == 0:
            compressed = file.format not in ("WAV", "WAVEX", "AIFF", "RAW")
            file.close()
            cause = "no decodable audio (truncated or corrupt)" if compressed else "contains no audio samples"
            raise AudioError(f"{self.name}: {cause}")
        self._header_frames, self._format = int(file.frames), file.format
        if isinstance(file, DecodedAudio):
            # A container's stated length (MP4, Matroska, Ogg) leaves out the encoder's padding that FFmpeg decodes
            # (and openai-whisper and faster-whisper transcribe): good for a limit, the exact length is counted.
            self._length_declared, self._length_known = file.length_declared, False
        else:
            self._length_declared = file.format == "MP3" and mp3_declares_length(self.name)
            self._length_known = self._header_frames < UNKNOWN_LENGTH and (file.format != "MP3" or self._length_declared)
        self._length_stated = self._length_known or self._length_declared
        self._total_frames = self._header_frames if self._length_known else None  # None: counted when asked
        self._block_frames = max(1, int(block_seconds * self.source_sample_rate))
        self._history = int(history_seconds * self.sample_rate)
        self._resampler = None if self.source_sample_rate == self.sample_rate else soxr.ResampleStream(
            self.source_sample_rate, self.sample_rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        self._frames_read, self._exhausted, self.in_memory = 0, False, False
        self._buf = np.zeros(0, dtype=np.float32)
        self._buf_start = 0  # index (at sample_rate) of self._buf[0]
        self._keep_from = 0  # reads may not start before this index

    @classmethod
    def from_array(cls, audio: np.ndarray, *, name: str = "<array>", sample_rate: int = SAMPLE_RATE) -> AudioStream:
        """Wrap samples already at ``sample_rate`` (2-D arrays are downmixed, integers scaled)."""
        self = cls.__new__(cls)
        self.name, self.sample_rate, self.source_sample_rate = name, sample_rate, sample_rate
        self._file, self._resampler = None, None
        self._buf = _to_mono_float32(audio, name)
        self._buf_start = self._keep_from = 0
        self._exhausted = self.in_memory = True
        self._header_frames = self._total_frames = self._frames_read = len(self._buf)
        self._length_known = self._length_stated = True
        return self

    # -- size ----------------------------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """True once the whole source has been decoded (``n_samples`` is then exact)."""
        return self._exhausted

    @property
    def length_known(self) -> bool:
        """True when the header's length is exact: False for a FLAC without its total (written by a streaming
        encoder), an MP3 without a Xing/Info/VBRI header, whose length libsndfile guesses from the file size, and
        the containers PyAV or ffmpeg decode (see ``stated_samples``)."""
        return self._length_known

    @property
    def stated_samples(self) -> int | None:
        """The length the header states, at ``sample_rate``, for a limit to refuse a file on before decoding it:
        the exact length where ``length_known``, a container's length for an MP4, most WebM and Ogg files (a few
        milliseconds short of what decodes: the encoder's padding); None where the header states none (a guess
        from the file size is not a statement)."""
        if not self._length_stated:
            return None
        return round(self._header_frames * self.sample_rate / self.source_sample_rate)

    @property
    def buffered_samples(self) -> int:
        """Samples held in memory now: a bound on what a stream holds, so tests and callers can check it stays bounded."""
        return len(self._buf)

    @property
    def n_samples(self) -> int:
        """Number of samples at ``sample_rate``: from the header where it is exact (see ``length_known``), else
        counted by decoding the file once ahead on first use (:func:`probe_duration` stops at a limit); exact
        once the end has been decoded."""
        if self._exhausted:
            return self._buf_start + len(self._buf)
        if self._total_frames is None:
            with _open_file(self.name, self.sample_rate) as file:
                self._total_frames = count_frames(file, self.name)
        return round(self._total_frames * self.sample_rate / self.source_sample_rate)

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
            raise ValueError(f"{self.name}: sample {start_sample} was already released by the stream (reads may "
                             f"reach back to {self._keep_from}); use load_audio() for random access")
        end = start_sample + n_samples
        if not self.in_memory:
            keep_from = max(self._keep_from, min(start_sample, end - self._history))
            self._decode_until(end, keep_from)
            self._keep_from = keep_from
        return self._buf[start_sample - self._buf_start : end - self._buf_start].copy()

    def read_all(self) -> np.ndarray:
        """Every sample from the start (only before the stream has released any)."""
        if self._keep_from > 0:
            raise ValueError(f"{self.name}: the stream has already released its beginning")
        if not self.in_memory:
            self._decode_until(None, 0)
        return self._buf.copy()

    def _decode_until(self, end: int | None, keep_from: int) -> None:
        """Decode forward until index ``end`` (None: to the end), releasing samples before ``keep_from``."""
        pieces, start, length = [self._buf], self._buf_start, len(self._buf)
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
        try:
            block = read_block(self._file, self.name, self._frames_read, self._block_frames)
        except AudioError:
            self.close()
            raise
        self._frames_read += len(block)
        mono = block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]
        # A decoder says where its output ends, so that a block reaching past a header's length (an encoder's
        # padding after it) ends the stream with its exact length, not one read later.
        last = len(block) == 0 or (isinstance(self._file, DecodedAudio) and self._file.ended)
        if last:
            self._exhausted = True
            self.close()
            self._check_complete()
        if self._resampler is None:
            return np.ascontiguousarray(mono, dtype=np.float32)
        return self._resampler.resample_chunk(np.ascontiguousarray(mono), last=last)

    def _check_complete(self) -> None:
        """A file whose header counts more frames than decoded was cut off (libmpg123 only warns of an MP3's end,
        FFmpeg decodes what an MP4 or a WebM still holds)."""
        missing = self._header_frames - self._frames_read
        if self._length_declared and missing > max(2 * 1152, 0.01 * self._header_frames):
            rate = self.source_sample_rate
            raise AudioError(f"{self.name}: truncated {self._format} file: the header declares "
                             f"{self._header_frames / rate:.1f} s "
                             f"of audio but only {self._frames_read / rate:.1f} s are present")

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
        known = self._exhausted or self._total_frames is not None  # never a whole decode to show a length
        return (f"AudioStream({self.name!r}, duration={f'{self.duration:.2f}s' if known else 'unknown'}, "
                f"source_rate={self.source_sample_rate})")


def open_audio(source: AudioSource, *, sample_rate: int = SAMPLE_RATE) -> AudioStream:
    """An :class:`AudioStream` for an array (in memory) or a file (streamed: through libsndfile where it reads the
    format, else PyAV or the ffmpeg command)."""
    if isinstance(source, np.ndarray):
        if sample_rate != SAMPLE_RATE:
            source = soxr.resample(_to_mono_float32(source, "<array>"), SAMPLE_RATE, sample_rate)
        return AudioStream.from_array(source, sample_rate=sample_rate)
    if not isinstance(source, (str, os.PathLike)):
        raise AudioError(f"{source!r}: expected a file path or a numpy array")
    return AudioStream(source, sample_rate=sample_rate)


def _open_file(name: str, sample_rate: int) -> sf.SoundFile | DecodedAudio:
    """``name`` opened by libsndfile where it reads the format, else by a decoder that serves ``sample_rate``."""
    file, reason = open_soundfile(name)
    return file if file is not None else open_decoded(name, sample_rate, reason)


def probe_duration(source: AudioSource, limit_seconds: float) -> float:
    """The exact length of ``source`` in seconds, for a length limit checked before transcribing: from the header
    where it is exact or states more than ``limit_seconds``, else decoded forward, stopping once past
    ``limit_seconds`` (the length returned is then just over the limit). Float PCM, the only kind whose values can be NaN, infinite or absurd, is read through (up to
    the limit) so that such a file fails here, with the AudioError the transcription would raise later."""
    with open_audio(source) as stream:
        if stream.in_memory:  # an array: checked whole already
            return stream.duration
        assert stream._file is not None  # a fresh stream: nothing read yet
        rate, float_pcm = stream.source_sample_rate, stream._file.subtype in ("FLOAT", "DOUBLE")
        over_limit = stream._length_stated and stream._header_frames > limit_seconds * rate
        if over_limit or (stream.length_known and not float_pcm):
            return stream._header_frames / rate
        limit = int(limit_seconds * rate) if math.isfinite(limit_seconds) else None
        return count_frames(stream._file, stream.name, limit) / rate


def load_audio(source: AudioSource, sr: int = SAMPLE_RATE) -> np.ndarray:
    """The whole signal as float32 mono at ``sr`` Hz. Arrays are taken as 16 kHz (integers scaled)."""
    with open_audio(source, sample_rate=sr) as stream:
        return stream.read_all()
