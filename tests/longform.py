"""Long test files (60-120 s) built from short English speech clips, so the seek loop, the previous-text prompt
and word timing across windows can be compared with reference implementations.

Clips come from the speech corpus (``../shared/corpus``, English entries of manifest.jsonl) when it is present,
else from the English clips in tests/data. They are concatenated in a seeded shuffled order with ~1 s gaps of
digital silence or of low white noise, in memory: nothing is written to disk.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conftest import CORPUS_DIR, DATA_DIR

from whisperane.audio import SAMPLE_RATE, load_audio

# English speech in tests/data (tests/data/README.md), the fallback when the corpus is absent.
DATA_ENGLISH_CLIPS = (
    "jfk.flac",
    "1089-134686-0001.flac",
    "1089-134691-0000.flac",
    "1089-134691-0001.flac",
    "LJ001-0002.flac",
    "LJ001-0008.flac",
)
GAP_SECONDS = (0.8, 1.2)  # each gap's length is drawn uniformly from this range


@dataclass(frozen=True)
class LongAudio:
    """A long file: float32 16 kHz mono samples and where each clip starts in it."""

    name: str
    samples: np.ndarray
    clip_ids: tuple[str, ...]
    clip_starts: tuple[float, ...]  # seconds
    clip_ends: tuple[float, ...]

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def english_clips(corpus_dir: Path = CORPUS_DIR) -> dict[str, Path]:
    """{clip id: audio path} of the corpus's English clips, or of tests/data's when the corpus is absent."""
    manifest = corpus_dir / "manifest.jsonl"
    if not manifest.is_file():
        return {Path(name).stem: DATA_DIR / name for name in DATA_ENGLISH_CLIPS}
    entries = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {e["id"]: corpus_dir / e["audio"] for e in entries if e["language"] == "en"}


@functools.lru_cache(maxsize=64)
def _clip_samples(path: Path) -> np.ndarray:
    samples = load_audio(path)
    samples.flags.writeable = False  # shared by every file built in this process
    return samples


def _gap(rng: np.random.Generator, noise_dbfs: float | None) -> np.ndarray:
    n = int(rng.uniform(*GAP_SECONDS) * SAMPLE_RATE)
    if noise_dbfs is None:
        return np.zeros(n, dtype=np.float32)
    rms = 10.0 ** (noise_dbfs / 20.0)
    return (rng.standard_normal(n) * rms).astype(np.float32)


def _clip_order(clip_ids: list[str], rng: np.random.Generator, min_seconds: float, max_seconds: float,
                durations: dict[str, float]) -> list[str]:
    """Clips in shuffled passes (reshuffled each pass, so a short clip list still fills a long file) until the
    total reaches ``min_seconds``, skipping a clip that would take it past ``max_seconds``."""
    order: list[str] = []
    total = 0.0
    while total < min_seconds:
        added = False
        for clip_id in rng.permutation(clip_ids):
            length = durations[clip_id] + GAP_SECONDS[1]
            if total + length + GAP_SECONDS[1] <= max_seconds:
                order.append(str(clip_id))
                total += length
                added = True
            if total >= min_seconds:
                break
        if not added:
            raise ValueError(f"no clip fits a file of {min_seconds}-{max_seconds} s")
    return order


def long_audio_name(seed: int, noise_dbfs: float | None) -> str:
    return f"long-seed{seed}-" + ("silence" if noise_dbfs is None else f"noise{noise_dbfs:g}dB")


def build_long_audio(seed: int, min_seconds: float = 60.0, max_seconds: float = 120.0,
                     noise_dbfs: float | None = None, clips: dict[str, Path] | None = None) -> LongAudio:
    """A file of ``min_seconds``..``max_seconds`` of English clips in a shuffled order (``seed``), each clip
    preceded by a gap, plus a final gap. Gaps are digital silence, or white noise at ``noise_dbfs`` RMS."""
    clips = english_clips() if clips is None else clips
    durations = {clip_id: len(_clip_samples(path)) / SAMPLE_RATE for clip_id, path in clips.items()}
    rng = np.random.default_rng(seed)
    order = _clip_order(sorted(clips), rng, min_seconds, max_seconds, durations)
    pieces: list[np.ndarray] = []
    starts: list[float] = []
    ends: list[float] = []
    position = 0
    for clip_id in order:
        gap = _gap(rng, noise_dbfs)
        speech = _clip_samples(clips[clip_id])
        starts.append((position + len(gap)) / SAMPLE_RATE)
        pieces += [gap, speech]
        position += len(gap) + len(speech)
        ends.append(position / SAMPLE_RATE)
    pieces.append(_gap(rng, noise_dbfs))
    return LongAudio(
        long_audio_name(seed, noise_dbfs),
        np.concatenate(pieces).astype(np.float32),
        tuple(order),
        tuple(starts),
        tuple(ends),
    )
