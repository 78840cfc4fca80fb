"""Where a stream's audio comes from: a file (paced at real time, or as fast as it is read), raw PCM from a
binary file object (standard input), a microphone; and the clocks that pace them.

Every source yields float32 mono 16 kHz chunks. A live source (``arrivals``) yields, each time it is asked,
all the audio that arrived since it was last asked, so that an update slower than real time is followed by
one over everything it missed, never by a growing backlog.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np
import soxr

from ..audio import RESAMPLE_QUALITY, SAMPLE_RATE, open_audio
from ..errors import AudioError

PCM_FORMATS = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
CHUNK_S = 0.1  # the read size of stdin and the microphone
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4000, 384000


class WallClock:
    """Seconds since the clock was made; ``sleep`` waits."""

    def __init__(self):
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimulatedClock(WallClock):
    """Processing time counts as it passes, but waiting for audio takes none: ``sleep`` moves the clock on
    at once (a real-time simulation at compute speed, for tests)."""

    def __init__(self):
        super().__init__()
        self._skipped = 0.0

    def now(self) -> float:
        return super().now() + self._skipped

    def sleep(self, seconds: float) -> None:
        self._skipped += max(seconds, 0.0)


def file_chunks(path: str | os.PathLike, chunk_s: float) -> Iterator[np.ndarray]:
    """A file's audio (16 kHz mono) in chunks of ``chunk_s`` seconds."""
    size = max(1, round(chunk_s * SAMPLE_RATE))
    with open_audio(path) as audio:
        start = 0
        while len(block := audio.read(start, size)):
            yield block
            start += len(block)


def paced(chunks: Iterable[np.ndarray], clock: WallClock, step_s: float) -> Iterator[np.ndarray]:
    """Audio as it would arrive live (sample i at i / 16 kHz on ``clock``): whenever asked, all that has
    arrived and not been given, once at least ``step_s`` of it is there (the clock sleeps until then)."""
    source = iter(chunks)
    pending: list[np.ndarray] = []
    n_pending, given, exhausted = 0, 0, False
    step = max(1, round(step_s * SAMPLE_RATE))
    while True:
        arrived = int(clock.now() * SAMPLE_RATE)
        while not exhausted and given + n_pending < arrived + step:
            block = next(source, None)
            if block is None:
                exhausted = True
            else:
                pending.append(block)
                n_pending += len(block)
        if exhausted and n_pending == 0:
            return
        available = min(arrived - given, n_pending)
        if available < min(step, n_pending):
            clock.sleep((given + min(step, n_pending)) / SAMPLE_RATE - clock.now())
            continue
        audio = np.concatenate(pending)
        yield audio[:available]
        pending, n_pending, given = [audio[available:]], n_pending - available, given + available


def pcm_chunks(file: BinaryIO, pcm_format: str = "s16le", sample_rate: int = SAMPLE_RATE,
               chunk_s: float = CHUNK_S, name: str = "standard input") -> Iterator[np.ndarray]:
    """Raw mono PCM read from a binary file object, converted to float32 16 kHz (soxr resamples other rates).
    A stream that ends inside a sample is an AudioError, after every whole sample was given."""
    dtype = _pcm_dtype(pcm_format)
    check_sample_rate(sample_rate)
    resampler = None
    if sample_rate != SAMPLE_RATE:
        resampler = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality=RESAMPLE_QUALITY)
    size = max(1, round(chunk_s * sample_rate)) * dtype.itemsize
    while True:
        data = _read_exactly(file, size)
        whole = len(data) // dtype.itemsize * dtype.itemsize
        samples = np.frombuffer(data[:whole], dtype=dtype).astype(np.float32)
        if dtype.kind == "i":
            samples /= 32768.0
        last = len(data) < size
        if resampler is not None:
            samples = resampler.resample_chunk(samples, last=last)
        if len(samples):
            yield samples
        if whole != len(data):
            raise AudioError(f"{name}: truncated {pcm_format} PCM: it ended {len(data) - whole} byte(s) into a sample")
        if last:
            return


def check_sample_rate(rate: int) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"unsupported sample rate {rate!r} Hz (use {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE})")


def _pcm_dtype(pcm_format: str) -> np.dtype:
    if pcm_format not in PCM_FORMATS:
        raise AudioError(f"unknown PCM format {pcm_format!r}; use {' or '.join(PCM_FORMATS)}")
    return PCM_FORMATS[pcm_format]


def _read_exactly(file: BinaryIO, size: int) -> bytes:
    """``size`` bytes, fewer only at the end of the stream (a pipe gives what it holds on each read)."""
    parts, n = [], 0
    while n < size:
        data = file.read(size - n)
        if not data:
            break
        parts.append(data)
        n += len(data)
    return b"".join(parts)


def mic_chunks(sample_rate: int = SAMPLE_RATE, chunk_s: float = CHUNK_S) -> Iterator[np.ndarray]:
    """The default input device through ``sounddevice`` (the optional extra ``whisperane[mic]``)."""
    check_sample_rate(sample_rate)
    try:
        import sounddevice
    except (ImportError, OSError) as e:  # OSError: the package without its PortAudio library
        raise AudioError(f"--mic needs the sounddevice package and PortAudio: pip install 'whisperane[mic]' ({e})") from None
    blocks: queue.Queue = queue.Queue()

    def callback(indata, frames, time_info, status):
        blocks.put(indata[:, 0].copy())

    try:
        stream = sounddevice.InputStream(samplerate=sample_rate, channels=1, dtype="float32",
                                         blocksize=round(chunk_s * sample_rate), callback=callback)
    except Exception as e:  # noqa: BLE001 - PortAudio's errors (no device, busy, unsupported rate) come as several types
        raise AudioError(f"microphone: {' '.join(str(e).split()) or type(e).__name__}") from None
    resampler = None
    if sample_rate != SAMPLE_RATE:
        resampler = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality=RESAMPLE_QUALITY)
    with stream:
        while True:
            try:
                block = blocks.get(timeout=max(2.0, 10 * chunk_s))
            except queue.Empty:
                raise AudioError("microphone: the input device stopped delivering audio") from None
            yield resampler.resample_chunk(block) if resampler is not None else block


_END = object()


def arrivals(chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """A live source read on its own thread: each item is all the audio that arrived since the last one (the
    first item waits for audio). An error of the source is raised here, after the audio before it."""
    blocks: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            for block in chunks:
                blocks.put(block)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            blocks.put(e)
        blocks.put(_END)

    threading.Thread(target=read, name="whisperane-live-source", daemon=True).start()
    while True:
        items = [blocks.get()]
        while not blocks.empty():
            items.append(blocks.get())
        audio = [x for x in items if isinstance(x, np.ndarray)]
        if audio:
            yield np.concatenate(audio)
        for x in items:
            if isinstance(x, BaseException):
                raise x
        if any(x is _END for x in items):
            return
