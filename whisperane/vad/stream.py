"""The speech of an audio, read like an ``AudioStream`` in bounded memory (``SpeechStream``, ``speech_stream``):
what ``vad_filter`` and batched mode transcribe."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from ..audio import CHUNK_LENGTH, AudioSource, AudioStream, open_audio
from ..errors import AudioError, OptionsError
from .regions import SpeechRegion, SpeechTimestampsMap, VadOptions, speech_regions
from .silero import SileroVad, default_vad


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
        # the speech guard) are derived from them without a second VAD pass.
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

    @property
    def buffered_samples(self) -> int:
        """Samples held in memory now, its reader's included: a bound, so tests and callers can check it stays bounded."""
        return len(self._buf) + self._reader.buffered_samples

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
    read. Audio already in memory (an array, an array stream) is read in place.
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
        reader = first if first.in_memory else open_audio(first.name, sample_rate=first.sample_rate)
    except BaseException:
        if first is not source:
            first.close()
        raise
    if reader is not first and first is not source:
        first.close()
    return SpeechStream(reader, regions, n_samples, probabilities)
