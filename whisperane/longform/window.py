"""One 30 s window of the seek loop (``Window``), read from an audio stream and encoded (``read_window``), and
the clips of ``clip_timestamps`` in mel frames."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, AudioStream
from ..runtime.decoder_adapters import CrossAttention
from ..runtime.model import WhisperaneModel

SILENCE_PEAK = 1e-4  # -80 dBFS: below any recorded speech; such a window holds nothing to transcribe


def read_window(model: WhisperaneModel, stream: AudioStream, seek: int, n_frames: int, file_peak: float | None,
                 encode: bool = True, heard: Callable[[np.ndarray], bool] | None = None,
                 ) -> tuple[CrossAttention | None, np.ndarray, np.ndarray | None]:
    """The window at ``seek``: its encoding (or, without ``encode``, its log-mel for a batch encoded together),
    its samples. Neither for digital silence, where Whisper is known to invent " you" (with a no-speech
    probability that the log-probability rule overrides), nor for samples in which ``heard`` hears no voice."""
    start = seek * HOP_LENGTH
    samples = stream.read(start, min(n_frames * HOP_LENGTH, N_SAMPLES))
    peak = float(np.abs(samples).max()) if len(samples) else 0.0
    if peak < SILENCE_PEAK or (heard is not None and not heard(samples)):
        return None, samples, None
    mel = model.log_mel(samples, file_peak)
    return (model.encode(mel), samples, None) if encode else (None, samples, mel)


@dataclass(frozen=True)
class Window:
    """One 30 s window of the seek loop: where it starts, how much audio it holds, and its encoding (None for
    digital silence)."""

    seek: int  # mel frame of the window's start
    size: int  # mel frames of audio in the window (less than N_FRAMES at the end or a clip's end)
    enc: CrossAttention | None
    samples: np.ndarray
    mel: np.ndarray | None = None  # a window read to be encoded with others (SeekLoop.next_window)

    @property
    def held_frames(self) -> int:
        """Mel frames of audio the window holds (its last one partial)."""
        return -(-len(self.samples) // HOP_LENGTH)

    @property
    def is_silence(self) -> bool:
        return self.enc is None and self.mel is None

    @property
    def time_offset(self) -> float:
        return float(self.seek * HOP_LENGTH / SAMPLE_RATE)

    @property
    def end_time(self) -> float:
        return float((self.seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE)

    @property
    def duration(self) -> float:
        return self.size * HOP_LENGTH / SAMPLE_RATE

    def audio_end(self, content_frames: int, n_samples: int) -> float:
        """Where the window's audio ends (seconds of the stream): the stream's end for its last window (whose
        partial last frame it holds), else its last frame. ``content_frames`` and ``n_samples``: the stream's."""
        end = n_samples if self.seek + self.size >= content_frames else (self.seek + self.size) * HOP_LENGTH
        return end / SAMPLE_RATE

    def frame(self, t: float) -> int:
        """The mel frame, from the window's start, of time ``t`` (seconds of the stream)."""
        return round((t - self.time_offset) * FRAMES_PER_SECOND)

    def time(self, frame: int) -> float:
        """The time (seconds of the stream) of mel frame ``frame`` from the window's start."""
        return self.time_offset + frame / FRAMES_PER_SECOND


def clip_ranges(clip_timestamps: Sequence[float], content_frames: int) -> list[tuple[int, int]]:
    frames = [round(v * FRAMES_PER_SECOND) for v in clip_timestamps]
    if len(frames) % 2 == 1:
        frames.append(content_frames)
    return [(min(s, content_frames), min(e, content_frames)) for s, e in zip(frames[::2], frames[1::2], strict=True)]
