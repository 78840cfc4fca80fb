"""Audio files through libsndfile (audio_decode.py decodes the containers it cannot read): opening, forward reads
that refuse what is not audio, lengths libsndfile cannot know, and one-line errors for files that cannot be read.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import soundfile as sf

from .errors import AudioError

# Audio lies within +-1 (float files written at integer scale reach about 3.3e4); a sample beyond this is not
# audio, and passed on it would turn the log-mel non-finite far from the file that caused it.
MAX_SAMPLE_MAGNITUDE = 1e6
UNKNOWN_LENGTH = 2**62  # libsndfile reports SF_COUNT_MAX frames for a length it does not know

# Extensions libsndfile decodes itself; a file with one of these that it cannot open is broken, not exotic.
SOUNDFILE_EXTENSIONS = {fmt.lower() for fmt in sf.available_formats()} | {
    "wave", "oga", "opus", "aif", "aifc", "snd", "sf", "mpeg"}


def check_samples(block: np.ndarray, name: str, offset_seconds: float, rate: int) -> None:
    """Refuse NaN, infinite and absurdly large samples (``block``: (frames[, channels]) from ``offset_seconds``)."""
    if not block.size or np.abs(block).max() <= MAX_SAMPLE_MAGNITUDE:  # NaN fails the comparison too
        return
    flat = block.reshape(-1)
    first_bad = int(np.argmax(~(np.abs(flat) <= MAX_SAMPLE_MAGNITUDE)))
    at = offset_seconds + first_bad // (flat.size // len(block)) / rate
    value = float(flat[first_bad])
    kind = "NaN or infinite sample values" if not math.isfinite(value) else (
        f"absurdly large sample values (magnitude {abs(value):.3g}; full scale is 1)")
    raise AudioError(f"{name}: contains {kind} (first at {at:.2f} s)")


def check_path(path: str | os.PathLike) -> str:
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
    """Reject a RIFF/WAVE file whose data chunk declares more bytes than the file holds: libsndfile silently
    shortens such files to what is there, and a cut-off recording would be transcribed as if complete. Sizes 0
    and 0xFFFFFFFF are placeholders written by recorders that never finalised the header: read as far as it goes."""
    size = os.path.getsize(name)
    with open(name, "rb") as f:
        pos = 12
        while pos + 8 <= size:
            f.seek(pos)
            chunk_id, chunk_size = struct.unpack("<4sI", f.read(8))
            if chunk_id == b"data":
                available = size - pos - 8
                if chunk_size not in (0, 0xFFFFFFFF) and chunk_size > available:
                    raise AudioError(f"{name}: truncated WAV file: the header declares {chunk_size} bytes of "
                                     f"audio but only {available} are present")
                return
            pos += 8 + chunk_size + (chunk_size & 1)


class ForwardFile(sf.SoundFile):
    """A SoundFile read strictly forward: soundfile seeks to its own count after every read of a seekable file,
    which fails at the end of one whose length libsndfile does not know (a FLAC from a streaming encoder)."""

    def seekable(self) -> bool:
        return False


def open_soundfile(name: str) -> tuple[sf.SoundFile | None, str | None]:
    """Open with libsndfile; on failure return the reason instead of raising (PyAV or ffmpeg may still cope)."""
    try:
        file = ForwardFile(name)
    except Exception as e:  # noqa: BLE001 - libsndfile raises LibsndfileError, RuntimeError, TypeError...
        return None, one_line(e)
    if file.format == "MP3" and file.frames > 0 and not mp3_declares_length(name):
        # libsndfile stops reading an MP3 file at its estimate of the length (the file's size over the first
        # frame's bitrate: far too short for VBR), but has none for a pipe and decodes that to its end
        piped = opened_through_pipe(name)
        if piped is not None:
            file.close()
            return piped, None
    return file, None


def opened_through_pipe(name: str) -> sf.SoundFile | None:
    """``name`` opened through a pipe that a thread fills (None where libsndfile cannot read it so)."""
    read_end, write_end = os.pipe()

    def feed() -> None:  # ends quietly where the reader closes the pipe first (or the file went away)
        with open(write_end, "wb", buffering=0) as pipe, contextlib.suppress(OSError), open(name, "rb") as f:
            shutil.copyfileobj(f, pipe)

    threading.Thread(target=feed, name=f"pipe {name}", daemon=True).start()
    try:
        return ForwardFile(read_end)  # libsndfile closes the read end on failure too, which ends the thread
    except Exception:  # noqa: BLE001 - libsndfile raises several types
        return None


def read_block(file: sf.SoundFile, name: str, at_frame: int, frames: int) -> np.ndarray:
    """Up to ``frames`` frames (fewer or none at the end) of ``file``, whose read position is ``at_frame``, as
    float32 (frames, channels); a decoding failure or samples that are not audio raise AudioError."""
    rate = file.samplerate
    try:
        block = file.read(frames, dtype="float32", always_2d=True)
    except Exception as e:  # noqa: BLE001 - libsndfile errors come in several types
        raise AudioError(f"{name}: corrupt or truncated audio (decoding failed between {at_frame / rate:.1f} s "
                         f"and {(at_frame + frames) / rate:.1f} s: {one_line(e)})") from e
    check_samples(block, name, at_frame / rate, rate)
    return block


def count_frames(file: sf.SoundFile, name: str, limit: int | None = None) -> int:
    """Frames from ``file``'s start (its read position) to its end, or to one frame past ``limit``."""
    n, step = 0, 10 * file.samplerate
    while limit is None or n <= limit:
        block = read_block(file, name, n, step if limit is None else min(step, limit + 1 - n))
        if not len(block):
            break
        n += len(block)
    return n


def one_line(e: BaseException) -> str:
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


def mp3_declares_length(name: str) -> bool:
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


def undecodable(name: str, reason: str | None) -> AudioError:
    """The error for a file libsndfile cannot read when there is neither PyAV nor ffmpeg to fall back on."""
    ext = Path(name).suffix.lower().lstrip(".")
    if ext in SOUNDFILE_EXTENSIONS:
        return AudioError(f"{name}: not a valid {ext.upper()} file or corrupt ({reason})")
    kind = f".{ext} files" if ext else "this format"
    return AudioError(f"{name}: PyAV or ffmpeg is needed to decode {kind} (libsndfile: {reason}); install "
                      "whisperane[av] or ffmpeg, or convert the file to WAV/FLAC")
