"""``multilingual`` on files that change language clip by clip: each clip's WER (CER for ja/zh/ko) inside the file
against the same clip transcribed alone, pooled per language.

    python benchmarks/bench_multilingual.py --model base [--corpus ../shared/corpus] [--out results.json]

The files alternate the corpus's English clips with its clips in other languages, 1 s of silence between clips:
one of short clips (the shorter half of the English ones), one of long ones. Each is transcribed by default
(everything in the first window's language) and with ``multilingual=True``; each clip alone by default (its
language detected) and with its language given. A clip's text in a file is that of the segments whose middle
falls inside it (0.5 s of slack either side).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Scorer, load_corpus, loadavg, pct, read_16k_mono  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLE_RATE = 16000
PAUSE_S = 1.0
MODES = ("alone (detected)", "alone (given)", "file default", "file multilingual")


def build_files(clips) -> dict[str, list]:
    """Two orders of clips: English clips alternating with the others, the short English ones and the long ones."""
    english = sorted((c for c in clips if c.language == "en"), key=lambda c: c.duration)
    others = [c for c in clips if c.language != "en"]
    half = len(english) // 2
    files = {}
    for name, pool in (("short", english[:half]), ("long", english[half:])):
        order = []
        for i, other in enumerate(others):
            order += [pool[i % len(pool)], other]
        files[name] = order + [pool[len(others) % len(pool)]]
    return files


def clip_texts(result, spans) -> list[str]:
    """The text of the segments whose middle falls inside each span (seconds), in order."""
    return ["".join(s.text for s in result.segments if a - 0.5 <= (s.start + s.end) / 2 <= b + 0.5) for a, b in spans]


def run(model_name: str, corpus: Path) -> dict:
    import whisperane

    model = whisperane.load_model(model_name)
    scorer, clips = Scorer(), load_corpus(corpus)
    errors: dict[str, dict[str, list[int]]] = {m: defaultdict(lambda: [0, 0]) for m in MODES}
    per_clip, timings = [], {}
    for file_name, order in build_files(clips).items():
        audio, spans, t = [], [], 0.0
        for clip in order:
            samples = read_16k_mono(clip.path)
            spans.append((t, t + len(samples) / SAMPLE_RATE))
            audio += [samples, np.zeros(int(PAUSE_S * SAMPLE_RATE), np.float32)]
            t = spans[-1][1] + PAUSE_S
        audio = np.concatenate(audio)
        texts = {}
        for mode, options in (("file default", {}), ("file multilingual", {"multilingual": True})):
            started = time.monotonic()
            texts[mode] = clip_texts(model.transcribe(audio, **options), spans)
            timings[f"{file_name} {mode}"] = round(time.monotonic() - started, 1)
        for i, clip in enumerate(order):
            samples = read_16k_mono(clip.path)
            row = {"file": file_name, "clip": clip.id, "language": clip.language,
                   "alone (detected)": model.transcribe(samples).text,
                   "alone (given)": model.transcribe(samples, language=clip.language).text,
                   "file default": texts["file default"][i], "file multilingual": texts["file multilingual"][i]}
            for mode in MODES:
                e, n = scorer.errors(clip.text, row[mode], clip.language)
                errors[mode][clip.language][0] += e
                errors[mode][clip.language][1] += n
                row[f"{mode} errors"] = [e, n]
            per_clip.append(row)
    return {"model": model_name, "errors": {m: dict(v) for m, v in errors.items()}, "clips": per_clip,
            "seconds": timings, "load": loadavg()}


def report(data: dict) -> str:
    languages = sorted({lang for mode in data["errors"].values() for lang in mode}, key=lambda x: (x != "en", x))
    lines = [f"model {data['model']}, load {data['load']}", "",
             "| language | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    for lang in languages:
        cells = [pct(*data["errors"][mode][lang]) for mode in MODES]
        lines.append(f"| {lang} | " + " | ".join(cells) + " |")
    lines += ["", "seconds: " + ", ".join(f"{k} {v}" for k, v in data["seconds"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="base")
    p.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    p.add_argument("--out", type=Path, help="write every clip's texts and errors as JSON here")
    args = p.parse_args(argv)
    if not (args.corpus / "manifest.jsonl").is_file():
        print(f"no corpus at {args.corpus}", file=sys.stderr)
        return 2
    os.environ.setdefault("WHISPERANE_THREADS", "2")
    data = run(args.model, args.corpus)
    if args.out:
        args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    print(report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
