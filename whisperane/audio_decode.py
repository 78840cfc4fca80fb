"""Containers libsndfile cannot read (m4a, mp4, webm, mkv, ...), decoded as a stream: through PyAV (``av``, the
``whisperane[av]`` extra) where it is installed, else the ``ffmpeg`` command read through a pipe. Either serves
mono float32 samples at the rate asked for, block by block, through the reading interface
:class:`whisperane.audio.AudioStream` uses for a soundfile, so memory does not grow with the length; the length is
taken from the container where it states it, so that a limit can refuse a file before any of it is decoded.

The samples are those openai-whisper's ``load_audio`` (ffmpeg to 16-bit mono) and faster-whisper's ``decode_audio``
(PyAV to 16-bit mono) read: FFmpeg's swresample resamples and downmixes to 16-bit, then the values are scaled to
[-1, 1). The rounding to 16 bits is kept on purpose: the int8 decoders' timestamps move with differences that
small, and these are the samples both references transcribe.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from .audio_files import SOUNDFILE_EXTENSIONS, UNKNOWN_LENGTH, one_line, undecodable
from .errors import AudioError

DECODER_VARIABLE = "WHISPERANE_AUDIO_DECODER"  # "av" or "ffmpeg" forces one decoder (unset: PyAV where installed)
DECODERS = ("av", "ffmpeg")
# Containers that state a track's length: MP4's sample tables, Matroska's durations, Ogg's last granule position.
# Elsewhere (ADTS AAC, raw MP3, ...) FFmpeg estimates it from the bit rate, which can be far off: it is counted.
CONTAINER_LABELS = {"mov,mp4,m4a,3gp,3g2,mj2": "MP4", "matroska,webm": "Matroska", "ogg": "Ogg"}
PIPE_BLOCK_BYTES = 2 * 16000  # one second of ffmpeg's 16 kHz 16-bit output per read of its pipe
FFPROBE_TIMEOUT_S = 30


class DecodedAudio:
    """A decoder's output behind the part of ``sf.SoundFile`` that AudioStream reads (``samplerate``, ``channels``,
    ``frames``, ``format``, ``subtype``, ``read``, ``close``): mono float32 at ``samplerate``, pulled from
    ``blocks`` only as far as a read asks. ``frames`` is the container's length (UNKNOWN_LENGTH where it states
    none); ``length_declared`` says it was stated, so that a file that decodes to much less was cut off."""

    channels = 1

    def __init__(self, blocks: Iterator[np.ndarray], samplerate: int, declared_seconds: float | None, label: str,
                 codec: str, stop: Callable[[], None]):
        self.samplerate = samplerate
        self.length_declared = declared_seconds is not None
        self.frames = UNKNOWN_LENGTH if declared_seconds is None else round(declared_seconds * samplerate)
        self.format = label
        self.subtype = codec.upper()  # never "FLOAT": 16-bit samples hold no NaN that probe_duration must look for
        self._blocks, self._stop = blocks, stop
        self._pending = np.zeros(0, np.float32)
        self._decoded_all = self.closed = False

    def read(self, frames: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        """Up to ``frames`` samples as a (frames, 1) float32 array; fewer (or none) at the end."""
        if dtype != "float32" or not always_2d:
            raise ValueError("a decoded stream reads float32 (frames, channels) blocks only")
        pieces, n = [self._pending], len(self._pending)
        while n < frames and not self.closed and not self._decoded_all:
            block = next(self._blocks, None)
            if block is None:
                self._decoded_all = True
            else:
                pieces.append(block)
                n += len(block)
        joined = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        self._pending = joined[frames:].copy()
        return joined[:frames, None]

    @property
    def ended(self) -> bool:
        """True once every sample has been read."""
        return self._decoded_all and not len(self._pending)

    def begin(self, name: str) -> DecodedAudio:
        """Decode the first samples now, so that a file FFmpeg opens but finds nothing in fails at its opening."""
        try:
            while not len(self._pending) and (block := next(self._blocks, None)) is not None:
                self._pending = block
            self._decoded_all = not len(self._pending)
        except Exception as e:  # noqa: BLE001 - what the decoder raises: its cause is the one line told
            self.close()
            raise AudioError(f"{name}: not an audio file FFmpeg can read, or damaged ({one_line(e)})") from None
        if not len(self._pending):
            self.close()
            raise AudioError(f"{name}: contains no audio samples")
        return self

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._blocks.close()
            self._stop()

    def __enter__(self) -> DecodedAudio:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_decoded(name: str, sample_rate: int, soundfile_reason: str | None) -> DecodedAudio:
    """``name`` (a file libsndfile could not read, for ``soundfile_reason``) through PyAV, or ffmpeg where PyAV is
    not installed or ``WHISPERANE_AUDIO_DECODER=ffmpeg``; neither: the error that says what to install."""
    choice = os.environ.get(DECODER_VARIABLE, "").strip().lower()
    if choice and choice not in DECODERS:
        raise AudioError(f"{DECODER_VARIABLE}={choice!r}: expected one of {', '.join(DECODERS)}")
    av, ffmpeg = _pyav() if choice != "ffmpeg" else None, shutil.which("ffmpeg") if choice != "av" else None
    if av is None and ffmpeg is None:
        raise undecodable(name, soundfile_reason)
    try:
        return _open_with_av(av, name, sample_rate) if av is not None else _open_with_ffmpeg(ffmpeg, name, sample_rate)
    except AudioError:
        if Path(name).suffix.lower().lstrip(".") in SOUNDFILE_EXTENSIONS:  # a broken WAV: libsndfile's own words
            raise undecodable(name, soundfile_reason) from None
        raise


def local(name: str) -> str:
    """``name`` as FFmpeg takes it for a file: absolute, so that a name like ``http:talk.m4a`` is not a URL."""
    return os.path.abspath(name)


def _pyav():
    try:
        import av
    except ImportError:
        return None
    return av


def declared_seconds(format_name: str, n_streams: int, stream_seconds: float | None, track_tag: str | None,
                     container_seconds: float | None) -> float | None:
    """An audio track's length where its container states it: the track's own duration, else the DURATION tag
    FFmpeg's Matroska muxer writes for each track, else the file's when the track is all the file holds."""
    if format_name not in CONTAINER_LABELS:
        return None
    if stream_seconds is not None and stream_seconds >= 0:
        return stream_seconds
    if track_tag:
        try:
            hours, minutes, seconds = track_tag.split(":")
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        except ValueError:
            pass
    return container_seconds if n_streams == 1 and container_seconds is not None and container_seconds >= 0 else None


# --------------------------------------------------------------------------------------------------
# PyAV


def _open_with_av(av, name: str, rate: int) -> DecodedAudio:
    try:
        container = av.open(local(name), metadata_errors="ignore")
    except (av.FFmpegError, ValueError, UnicodeDecodeError) as e:
        raise AudioError(f"{name}: not an audio file FFmpeg can read, or damaged ({_av_cause(e)})") from None
    if not container.streams.audio:
        video = bool(container.streams.video)
        container.close()
        raise AudioError(f"{name}: contains no audio stream{' (a video without sound)' if video else ''}")
    stream = container.streams.audio[0]
    if stream.codec_context is None:
        container.close()
        raise AudioError(f"{name}: FFmpeg has no decoder for its audio codec")
    seconds = declared_seconds(
        container.format.name, len(container.streams),
        None if stream.duration is None else float(stream.duration * stream.time_base),
        stream.metadata.get("DURATION"), None if container.duration is None else container.duration / 1e6)
    label = CONTAINER_LABELS.get(container.format.name, container.format.name.split(",")[0].upper())
    codec = stream.codec_context.name or ""
    return DecodedAudio(_av_blocks(av, container, stream, rate), rate, seconds, label, codec, container.close).begin(name)


def _av_blocks(av, container, stream, rate: int) -> Iterator[np.ndarray]:
    """The track's samples at ``rate``, mono, frame by frame as they are decoded."""
    resampler, setup = None, None
    try:
        for packet in container.demux(stream):
            for frame in _decoded(av, packet):
                if (frame.format.name, frame.layout.name, frame.sample_rate) != setup:  # a new resampler if it changes
                    if resampler is not None:
                        yield from _scaled(resampler.resample(None))
                    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
                    setup = (frame.format.name, frame.layout.name, frame.sample_rate)
                yield from _scaled(resampler.resample(frame))
        if resampler is not None:
            yield from _scaled(resampler.resample(None))
    except av.FFmpegError as e:
        raise RuntimeError(_av_cause(e)) from None
    finally:
        container.close()


def _decoded(av, packet) -> list:
    """A packet's frames; none for a packet the decoder cannot use, which it skips as the ffmpeg command does
    (one damaged frame in an hour of audio)."""
    try:
        return packet.decode()
    except av.error.InvalidDataError:
        return []


def _scaled(frames: list) -> Iterator[np.ndarray]:
    for frame in frames:
        yield pcm_to_float(frame.to_ndarray()[0])


def pcm_to_float(pcm: np.ndarray) -> np.ndarray:
    """16-bit samples as float32 in [-1, 1), as openai-whisper scales them."""
    return pcm.astype(np.float32) / 32768.0


def _av_cause(e: BaseException) -> str:
    return " ".join(str(getattr(e, "strerror", None) or one_line(e)).split())


# --------------------------------------------------------------------------------------------------
# the ffmpeg command


def _open_with_ffmpeg(ffmpeg: str, name: str, rate: int) -> DecodedAudio:
    """ffmpeg decoding the first audio track to ``rate`` Hz mono 16-bit on its stdout, read a block at a time;
    its messages are drained on a thread (only the last kept) so that neither pipe fills and stalls it."""
    seconds, label, codec = _ffprobe(name)
    cmd = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-i", local(name), "-map", "0:a:0",
           "-f", "s16le", "-ac", "1", "-acodec", "pcm_s16le", "-ar", str(rate), "-"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise AudioError(f"{name}: could not run ffmpeg: {e}") from None
    messages: collections.deque[str] = collections.deque(maxlen=4)
    drain = threading.Thread(target=lambda: messages.extend(
        line for raw in proc.stderr if (line := raw.decode("utf-8", "replace").strip())), daemon=True)
    drain.start()

    def stop() -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        drain.join(timeout=5)

    first = proc.stdout.read(PIPE_BLOCK_BYTES)
    if not first:  # nothing decoded: a file that is not audio fails here, at once
        stop()
        if any("matches no streams" in line for line in messages):  # -map 0:a:0 found no audio track
            raise AudioError(f"{name}: contains no audio stream")
        if proc.returncode != 0:
            raise AudioError(f"{name}: ffmpeg could not decode it: {_ffmpeg_cause(messages, name, proc.returncode)}")
        raise AudioError(f"{name}: contains no audio samples")
    return DecodedAudio(_pipe_blocks(proc, first, messages, name), rate, seconds, label, codec, stop)


def _pipe_blocks(proc: subprocess.Popen, first: bytes, messages: collections.deque, name: str) -> Iterator[np.ndarray]:
    data = first
    while data:
        yield pcm_to_float(np.frombuffer(data[: len(data) // 2 * 2], "<i2"))
        data = proc.stdout.read(PIPE_BLOCK_BYTES)
    if proc.wait() != 0:
        raise RuntimeError("ffmpeg: " + _ffmpeg_cause(messages, name, proc.returncode))


def _ffmpeg_cause(messages: collections.deque, name: str, returncode: int) -> str:
    """ffmpeg's last message, without the file name it starts with (the error names the file once)."""
    cause = messages[-1] if messages else f"exit status {returncode}"
    return cause[len(local(name)) + 2 :] if cause.startswith(f"{local(name)}: ") else cause


def _ffprobe(name: str) -> tuple[float | None, str, str]:
    """The first audio track's declared length, the container's label and the codec, from ffprobe where it is
    on PATH (None, a label and '' where not: the length is then counted)."""
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        return None, "FFMPEG", ""
    cmd = [ffprobe, "-v", "error", "-select_streams", "a:0", "-of", "json", "-show_entries",
           "format=format_name,duration,nb_streams:stream=codec_name,duration:stream_tags=DURATION", local(name)]
    try:
        info = json.loads(subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, check=True,
                                         timeout=FFPROBE_TIMEOUT_S).stdout)
        container, stream = info.get("format", {}), (info.get("streams") or [{}])[0]
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
        return None, "FFMPEG", ""
    format_name = str(container.get("format_name", ""))
    seconds = declared_seconds(format_name, int(container.get("nb_streams", 0) or 0), _number(stream.get("duration")),
                               (stream.get("tags") or {}).get("DURATION"), _number(container.get("duration")))
    label = CONTAINER_LABELS.get(format_name, format_name.split(",")[0].upper() or "FFMPEG")
    return seconds, label, str(stream.get("codec_name", ""))


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
