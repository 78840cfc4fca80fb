"""Float32 beam 5 against openai-whisper's own beam search on every one-window corpus clip (issue 13).

tests/test_beam.py compares the shortest clips in CI; this runs the same comparison (imported from it, so both
hold the same rules: temperature 0.0 only, word timestamps off, segments' text and times, openai's near-ties)
on every clip of up to 30 s: tiny.en on the English clips, multilingual models on the other languages.
Prints a markdown table per model (identical or not, the first differing segment, openai's smallest score gap
between its two best final hypotheses, wall seconds of each side) and writes the same to ``--out``.

    python benchmarks/bench_beam_openai.py [--corpus ../shared/corpus] [--models tiny.en,base] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from bench import emit, loadavg, progress, table  # noqa: E402
from test_beam import TIE_MARGIN, BeamComparison, CorpusClip, compare_with_openai, one_window_clips  # noqa: E402

COLUMNS = ("clip", "language", "audio s", "identical", "first difference (#segment: ours \\| openai)",
           "openai margin", "whisperane s", "openai s")


def model_clips(model: str, corpus: Path) -> list[CorpusClip]:
    """The one-window clips a model is compared on: English for .en models, the other languages otherwise."""
    manifest = (corpus / "manifest.jsonl").read_text(encoding="utf-8").splitlines()
    return one_window_clips([json.loads(line) for line in manifest if line.strip()], corpus, model.endswith(".en"))


def report(model: str, comparisons: list[BeamComparison]) -> list[str]:
    """The model's table and a summary line (near-ties: a difference where openai's margin < TIE_MARGIN)."""
    rows = [(c.clip.id, c.clip.language, f"{c.clip.duration:.1f}", "yes" if c.identical else "**no**",
             c.difference.replace("|", "\\|") or "", f"{c.margin:.4f}", f"{c.ours_s:.1f}", f"{c.theirs_s:.1f}")
            for c in comparisons]
    differing = [c for c in comparisons if not c.identical]
    near_ties = [c.clip.id for c in differing if c.margin < TIE_MARGIN]
    ours, theirs = sum(c.ours_s for c in comparisons), sum(c.theirs_s for c in comparisons)
    return [f"\n## {model}\n", f"_load average at the end of the section: {loadavg()}_\n", table(COLUMNS, rows), "",
            f"{model}: {len(comparisons)} clips, {len(comparisons) - len(differing)} identical; differing: "
            f"{[c.clip.id for c in differing]}, of which near-ties (margin < {TIE_MARGIN}): {near_ties}; "
            f"wall s whisperane {ours:.1f}, openai {theirs:.1f}"]


def header(models: list[str], corpus: Path) -> list[str]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    cpu = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), platform.machine())
    return ["# Beam 5: whisperane float32 against openai-whisper's beam search\n",
            f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
            f"- machine: {cpu}; {os.cpu_count()} cores; load average {loadavg()}; Python {platform.python_version()}",
            f"- corpus: {corpus}; models {', '.join(models)}; beam 5, temperature 0.0, word timestamps off, "
            "float32 ONNX (whisperane) against openai-whisper's torch model on the same weights, 2 threads"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"), help="directory holding manifest.jsonl")
    p.add_argument("--models", default="tiny.en,base", help="comma-separated model names")
    p.add_argument("--out", help="also write the markdown here")
    args = p.parse_args(argv)
    corpus = Path(args.corpus).resolve()
    if not (corpus / "manifest.jsonl").is_file():
        p.error(f"{corpus}: no manifest.jsonl (pass --corpus)")
    from whisperane.convert.sources import resolve_source
    from whisperane.loading import resolve_bundle

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    lines = header(models, corpus)
    emit("\n".join(lines))
    start = time.perf_counter()
    for model in models:
        clips = model_clips(model, corpus)
        progress(f"{model}: {len(clips)} clips")
        comparisons = compare_with_openai(resolve_bundle(model).resolve(), Path(resolve_source(model).path), clips)
        section = report(model, comparisons)
        emit("\n".join(section))
        lines += section
    lines.append(f"\n_finished in {(time.perf_counter() - start) / 60:.1f} min; load average at end: {loadavg()}_")
    emit(lines[-1])
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
