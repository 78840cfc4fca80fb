"""Audio encoded at test (and benchmark) time by PyAV: whole signals into any container and codec, and hours of
quiet Opus in WebM made in seconds (ten seconds encoded, their packets repeated)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import av
import numpy as np


class WriteOnly:
    """A file a muxer can only append to (a pipe, a browser's MediaRecorder): it cannot go back to write the length."""

    def __init__(self, file):
        self.file = file

    def write(self, data) -> int:
        return self.file.write(data)


def encode(path: Path, samples: np.ndarray | Iterable[np.ndarray], rate: int, codec: str, container_format: str, *,
           bit_rate: int = 0, seekable: bool = True, container_options: dict | None = None) -> Path:
    """``samples`` ((frames, channels) float32, or such blocks one after another) encoded with ``codec`` into
    ``path``."""
    blocks = iter([samples] if isinstance(samples, np.ndarray) else samples)
    first = next(blocks)
    layout = "mono" if first.shape[1] == 1 else "stereo"
    with open(path, "wb") as f, av.open(f if seekable else WriteOnly(f), "w", format=container_format,
                                        container_options=container_options or {}) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        if bit_rate:
            stream.bit_rate = bit_rate
        pts = 0
        for block in itertools.chain([first], blocks):
            for start in range(0, len(block), 1024):
                piece = np.ascontiguousarray(block[start : start + 1024].T, dtype=np.float32)
                frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout=layout)
                frame.sample_rate, frame.pts = rate, pts
                pts += piece.shape[1]
                out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def noise_webm(path: Path, seconds: float, *, seekable: bool = True, rate: int = 16000) -> Path:
    """``seconds`` of very quiet noise as Opus at 6 kbit/s in WebM (the issue's upload): ten seconds encoded and
    their packets repeated, so that hours take seconds to make."""
    rng = np.random.default_rng(0)
    piece = (rng.standard_normal(10 * rate) * 0.001).astype(np.float32)
    with open(path, "wb") as f, av.open(f if seekable else WriteOnly(f), "w", format="webm") as out:
        stream = out.add_stream("libopus", rate=rate, layout="mono")
        stream.bit_rate = 6000
        packets = []
        for start in range(0, len(piece), rate // 50):
            frame = av.AudioFrame.from_ndarray(piece[None, start : start + rate // 50], format="flt", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            packets += stream.encode(frame)
        packets = [p for p in packets + stream.encode(None) if p.duration == packets[0].duration][:500]  # 20 ms each
        period = sum(p.duration for p in packets)
        for k in range(int(np.ceil(seconds * rate / period))):
            for p in packets:
                copy = av.Packet(bytes(p))
                copy.stream, copy.time_base, copy.duration = stream, p.time_base, p.duration
                copy.pts = copy.dts = p.pts + k * period
                out.mux(copy)
    return path


def video_without_sound(path: Path) -> Path:
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 20 * i, np.uint8), format="rgb24")
            out.mux(stream.encode(frame.reformat(format="yuv420p")))
        out.mux(stream.encode(None))
    return path
