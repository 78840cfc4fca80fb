"""The accuracy guard of every precision change (issue 12): candidate builds against the float32 build.

A candidate is a bundle directory, a compute type and transcribe options (``--candidate
LABEL=DIR[:COMPUTE_TYPE[:OPTION=VALUE,...]]``, repeatable, e.g. ``decode-words=models/tiny.en:int8:alignment=decode``;
the first model's int8 default is always measured as "today's int8", and each candidate's word times are also
given against today's int8). For each, on the corpus's English clips and on
long files of those clips in several orders (``--orders``; each order a rotation of the clip list, ~0.6 s apart,
``--minutes`` long), with tiny.en, 2 threads, greedy, word timestamps on, in process:

- WER against the references, and its difference from the float32 build's (the guard: within 0.3 points);
- short clips whose transcript is identical to float32's (the guard: no fewer than today's int8);
- word start/end differences from float32's on the words both give in the same order, median and 95th
  percentile (the guard: 20 ms / 60 ms);
- clips of the long files left without any word (the guard: none that float32 transcribes).

    python benchmarks/bench_precision.py --float32 models/tiny.en \\
        --candidate vocab4=/tmp/tiny4 [--orders 3] [--minutes 5] [--corpus ../shared/corpus]
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Scorer, build_long_file, load_corpus, loadavg, pct  # noqa: E402
from bench_guard import clips_without_words  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WER_POINTS, MEDIAN_MS, P95_MS = 0.3, 20.0, 60.0  # the guard


@dataclass
class Readings:
    """One build's transcripts: clip id -> (text, words [(word, start, end)]), long file -> the same."""

    clips: dict[str, tuple[str, list]]
    long: dict[str, tuple[str, list, int]]  # + clips left without words


def words_of(result) -> list[tuple[str, float, float]]:
    return [(w.word, w.start, w.end) for s in result.segments for w in s.words]


def read_build(bundle: Path, compute_type: str, clips, long_files, threads: int, options: dict) -> Readings:
    import whisperane

    model = whisperane.load_model(bundle, compute_type=compute_type, threads=threads)
    readings = Readings({}, {})
    for clip in clips:
        r = whisperane.transcribe(str(clip.path), model=model, **options)
        readings.clips[clip.id] = (r.text, words_of(r))
    for name, f in long_files.items():
        r = whisperane.transcribe(str(f.path), model=model, **options)
        readings.long[name] = (r.text, words_of(r), clips_without_words(r, f.spans))
    return readings


def time_differences(ours: list, theirs: list) -> list[float]:
    """|start| and |end| differences (ms) of the words in the longest matching runs of the two word lists,
    each word keyed by its 30 s stretch: the long files repeat their clips, and where two transcripts part
    ways a run of one copy's words could otherwise be matched with another copy's, minutes away (one such
    match gave a 95th percentile of 183 s)."""
    a, b = [(w[0], int(w[1] // 30)) for w in ours], [(w[0], int(w[1] // 30)) for w in theirs]
    out: list[float] = []
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        for i in range(block.size):
            x, y = ours[block.a + i], theirs[block.b + i]
            out += [1000 * abs(x[1] - y[1]), 1000 * abs(x[2] - y[2])]
    return out


def wer(scorer: Scorer, pairs: list[tuple[str, str]]) -> float:
    errors = totals = 0
    for reference, text in pairs:
        e, n = scorer.errors(reference, text, "en")
        errors, totals = errors + e, totals + n
    return float(pct(errors, totals))


def timing_row(r: Readings, today: Readings, clips, long_files) -> str:
    """Word start/end differences from today's int8, median / p95 ms, and clips whose text differs from today's."""
    diffs = [d for c in clips for d in time_differences(r.clips[c.id][1], today.clips[c.id][1])]
    diffs += [d for n in long_files for d in time_differences(r.long[n][1], today.long[n][1])]
    changed = sum(r.clips[c.id][0] != today.clips[c.id][0] for c in clips)
    return f"{np.median(diffs):.0f} / {np.percentile(diffs, 95):.0f} ({changed} clip texts differ)"


def summary_row(label: str, r: Readings, f32: Readings, clips, long_files, scorer: Scorer) -> list[str]:
    clip_wer = wer(scorer, [(c.text, r.clips[c.id][0]) for c in clips])
    long_wer = wer(scorer, [(f.reference, r.long[n][0]) for n, f in long_files.items()])
    f32_clip = wer(scorer, [(c.text, f32.clips[c.id][0]) for c in clips])
    f32_long = wer(scorer, [(f.reference, f32.long[n][0]) for n, f in long_files.items()])
    identical = sum(r.clips[c.id][0] == f32.clips[c.id][0] for c in clips)
    diffs = [d for c in clips for d in time_differences(r.clips[c.id][1], f32.clips[c.id][1])]
    diffs += [d for n in long_files for d in time_differences(r.long[n][1], f32.long[n][1])]
    wordless = sum(r.long[n][2] for n in long_files)
    return [label, f"{clip_wer:.2f} ({clip_wer - f32_clip:+.2f})", f"{long_wer:.2f} ({long_wer - f32_long:+.2f})",
            f"{identical}/{len(clips)}", f"{np.median(diffs):.0f} / {np.percentile(diffs, 95):.0f}",
            f"{wordless} (float32 {sum(f32.long[n][2] for n in long_files)})"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--float32", type=Path, default=ROOT / "models" / "tiny.en", help="the reference bundle")
    p.add_argument("--candidate", action="append", default=[], help="LABEL=DIR[:COMPUTE_TYPE] (default: int8)")
    p.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    p.add_argument("--orders", type=int, default=3, help="long files: rotations of the clip list")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "whisperane" / "bench")
    args = p.parse_args()
    clips = [c for c in load_corpus(args.corpus) if c.language == "en"]
    step = max(1, len(clips) // args.orders)
    long_files = {f"order {i}": build_long_file(clips, 60 * args.minutes, args.cache, rotate=i * step)
                  for i in range(args.orders)}
    builds = [("float32", args.float32, "float32", {}), ("today's int8", args.float32, "int8", {})]
    for spec in args.candidate:
        label, _, where = spec.partition("=")
        path, _, rest = where.partition(":")
        ctype, _, opts = rest.partition(":")
        options = {k: v for k, _, v in (o.partition("=") for o in opts.split(",") if o)}
        builds.append((label, Path(path), ctype or "int8", options))
    print(f"# Precision guard, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
          f"load {loadavg()}\n")
    print(f"{len(clips)} English corpus clips; long files: {args.orders} orders x {args.minutes:g} min "
          f"({', '.join(f'{f.duration:.0f} s' for f in long_files.values())}); greedy, word timestamps, "
          f"{args.threads} threads.\n")
    readings = {label: read_build(path, ctype, clips, long_files, args.threads, options)
                for label, path, ctype, options in builds}
    scorer = Scorer()
    print("| build | clips WER % (vs float32) | long WER % (vs float32) | clips identical to float32 | "
          "word times vs float32 median / p95 ms | long-file clips without words |")
    print("|---|---|---|---|---|---|")
    for label, *_ in builds:
        row = summary_row(label, readings[label], readings["float32"], clips, long_files, scorer)
        print("| " + " | ".join(row) + " |")
    print("\n| candidate | word times vs today's int8 median / p95 ms |\n|---|---|")
    for label, *_ in builds[2:]:
        row = timing_row(readings[label], readings["today's int8"], clips, long_files)
        print(f"| {label} | {row} |")
    print(f"\nGuard: WER within {WER_POINTS} points of float32's, clips identical no fewer than today's int8, "
          f"word times {MEDIAN_MS:.0f} / {P95_MS:.0f} ms, no clip without words that float32 transcribes.")


if __name__ == "__main__":
    main()
