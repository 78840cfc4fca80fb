"""Byte-identical outputs across a refactoring: the JSON ``whisperane transcribe`` writes for every corpus clip and
one long file, under five decoding configurations, from two checkouts.

    python benchmarks/check_identical.py run --root /path/to/old/checkout --out /tmp/ref --threads 1
    python benchmarks/check_identical.py run --root . --out /tmp/new --threads 1
    python benchmarks/check_identical.py compare /tmp/ref /tmp/new

``run`` runs the CLI of the checkout at ``--root`` (``PYTHONPATH`` pointing at it) once per configuration with all
inputs, writing ``OUT/<config>/<clip id>.json``. The inputs are the clips of ``--corpus`` (``manifest.jsonl``;
``tests/data`` when there is none) and a long English file built once by concatenating the corpus's English clips
with short pauses (``--long``, reused when it exists, so that both runs read the same samples). Keep ``--threads``
the same in both runs: int8 kernels may sum in another order with another thread count. ``compare`` lists every
file that differs or exists on one side only, and exits non-zero if any does.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {
    "tiny.en-sequential": ["--model", "tiny.en"],
    "tiny.en-batched8": ["--model", "tiny.en", "--batch-size", "8"],
    "tiny.en-beam5": ["--model", "tiny.en", "--beam-size", "5"],
    "tiny.en-vad": ["--model", "tiny.en", "--vad-filter", "True"],
    "base-sequential": ["--model", "base"],
}
PAUSES_S = (0.4, 0.9, 0.6, 1.2)  # cycled between clips: short pauses, some shorter than a VAD gap


def corpus_clips(corpus: Path) -> dict[str, tuple[Path, str]]:
    """Clip id -> (audio path, language)."""
    manifest = corpus / "manifest.jsonl"
    if not manifest.is_file():
        data = REPO / "tests" / "data"
        return {p.stem: (p, "en") for p in sorted(data.iterdir()) if p.suffix in (".flac", ".wav")}
    clips = {}
    for line in manifest.read_text().splitlines():
        row = json.loads(line)
        clips[row["id"]] = (corpus / row["audio"], row.get("language", "en"))
    return clips


def build_long_file(clips: dict[str, tuple[Path, str]], path: Path, root: Path) -> None:
    """The English clips one after the other with short pauses, 16 kHz 16-bit WAV."""
    import numpy as np
    import soundfile as sf

    sys.path.insert(0, str(root))
    from whisperane.audio import SAMPLE_RATE, load_audio

    parts = []
    for i, (audio, language) in enumerate(clips.values()):
        if language == "en":
            parts.append(load_audio(str(audio)))
            parts.append(np.zeros(int(PAUSES_S[i % len(PAUSES_S)] * SAMPLE_RATE), np.float32))
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")


def run(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    clips = corpus_clips(Path(args.corpus))
    long_path = Path(args.long)
    if not long_path.is_file():
        build_long_file(clips, long_path, root)
    inputs = Path(args.out) / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    for clip_id, (audio, _) in [*clips.items(), ("long-en", (long_path.resolve(), "en"))]:
        link = inputs / f"{clip_id}{audio.suffix}"
        if not link.exists():
            link.symlink_to(audio.resolve())
    files = sorted(str(p) for p in inputs.iterdir())
    env = {**os.environ, "PYTHONPATH": str(root)}
    for name, flags in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        out = Path(args.out) / name
        t0 = time.time()
        cmd = [sys.executable, "-m", "whisperane", "transcribe", *files, "--output-dir", str(out), "--overwrite",
               "--threads", str(args.threads), *flags]
        proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
        print(f"{name}: exit {proc.returncode}, {len(list(out.glob('*.json')))} files, {time.time() - t0:.0f} s",
              flush=True)
        if proc.returncode:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
    return 0


def compare(args: argparse.Namespace) -> int:
    a, b = Path(args.a), Path(args.b)
    names = sorted({p.relative_to(a) for p in a.glob("*/*.json")} | {p.relative_to(b) for p in b.glob("*/*.json")})
    bad = []
    for name in names:
        if not (a / name).is_file() or not (b / name).is_file():
            bad.append(f"{name}: on one side only")
        elif not filecmp.cmp(a / name, b / name, shallow=False):
            bad.append(f"{name}: differs")
    for line in bad:
        print(line)
    print(f"{len(names)} files compared, {len(names) - len(bad)} identical, {len(bad)} not")
    return 1 if bad or not names else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--root", default=str(REPO), help="checkout whose code runs (its models/ holds the bundles)")
    r.add_argument("--out", required=True)
    r.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    r.add_argument("--long", default=str(Path.home() / ".cache" / "whisperane" / "check_identical" / "long-en.wav"))
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--only", action="append", choices=list(CONFIGS), help="run only these configurations")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
