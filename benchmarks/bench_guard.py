"""The speech guard (issue 11): what it recovers and what it costs, in process, on the >= 10-minute English file.

For each configuration (compute type, greedy or beam 5, guard on or off) one transcription of the file with a
loaded tiny.en model, 2 threads, word timestamps on: WER against the clips' references, the clips left without a
word, wall and process CPU seconds, and how often and for how long the guard ran Silero VAD.

    python benchmarks/bench_guard.py [--corpus ../shared/corpus] [--minutes 10] [--out results.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Scorer, build_long_file, load_corpus, loadavg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# (label, compute type, beam size, guard)
CONFIGS = [
    ("int8 greedy, openai's seek rule", "default", None, False),
    ("int8 greedy, speech guard (default)", "default", None, True),
    ("int8 beam 5, openai's seek rule", "default", 5, False),
    ("int8 beam 5, speech guard", "default", 5, True),
]


class VadCalls:
    """Counts the guard's VAD runs and their CPU time (wraps VoiceOnDemand.runs, which both the speech guard and
    the rule for segments at one instant call)."""

    def __init__(self):
        from whisperane.longform import voice

        self.module = voice
        self.original = self.module.VoiceOnDemand.runs
        self.calls: list[float] = []
        clock = self

        def counted(voice, window, start, end):
            t = time.process_time()
            try:
                return clock.original(voice, window, start, end)
            finally:
                clock.calls.append(time.process_time() - t)

        self.module.VoiceOnDemand.runs = counted

    def reset(self) -> None:
        self.calls = []


def clips_without_words(result, spans) -> int:
    words = [(w.start + w.end) / 2 for s in result.segments for w in s.words]
    return sum(not any(a - 0.3 <= t <= b + 0.3 for t in words) for a, b in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(ROOT.parent / "shared" / "corpus"))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "whisperane" / "bench"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--greedy-only", action="store_true", help="the two greedy configurations alone")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"{datetime.date.today()}-guard.md"))
    args = parser.parse_args()
    import whisperane

    english = [c for c in load_corpus(Path(args.corpus)) if c.language == "en"]
    long_file = build_long_file(english, args.minutes * 60, Path(args.cache))
    scorer, vad, models = Scorer(), VadCalls(), {}
    lines = [f"# Seek guard, {args.model}, {long_file.path.name} ({long_file.duration:.0f} s, {len(long_file.spans)} clips)",
             "", f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()} {platform.processor() or ''}, "
             f"2 threads, word timestamps on, load at start {loadavg()}", "",
             "| configuration | WER % | clips without words | wall s | CPU s | VAD runs | VAD CPU s |",
             "|---|---|---|---|---|---|---|"]
    for label, compute_type, beam, guard in [c for c in CONFIGS if not (args.greedy_only and c[2])]:
        if compute_type not in models:
            models[compute_type] = whisperane.load_model(args.model, threads=2, compute_type=compute_type)
        vad.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        result = models[compute_type].transcribe(str(long_file.path), beam_size=beam, speech_guard=guard)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        errors, total = scorer.errors(long_file.reference, result.text, "en")
        row = (f"| {label} | {100 * errors / total:.2f} | {clips_without_words(result, long_file.spans)} | "
               f"{wall:.1f} | {cpu:.1f} | {len(vad.calls)} | {sum(vad.calls):.2f} |")
        print(row, flush=True)
        lines.append(row)
    lines += ["", f"load at end {loadavg()}"]
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
