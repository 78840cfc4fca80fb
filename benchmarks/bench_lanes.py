"""Batched mode's lanes against the sequential loops on gapped files (issue 11's bound), in process.

Three draws of test_vad's gapped audio (the English corpus clips with inserted gaps of digital silence, low noise
and music-like tones, 270-290 s each; gap seeds 5, 1, 2), tiny.en int8, 2 threads, each transcribed three ways:
batched (``batch_size=8``), the sequential loop over the VAD's speech (``vad_filter``) and the default sequential
loop over the whole audio (the speech guard on). WER per file and pooled over the three (their errors over their
words), after Whisper's English normalizer. The bound: pooled, batched at most half a point above each of the
others. The suite checks one draw with a per-file bound (tests/test_batched.py).

    PYTHONPATH=$PWD python benchmarks/bench_lanes.py [--bundle models/tiny.en] [--seeds 5 1 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from bench import loadavg  # noqa: E402

BOUND_POINTS = 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "models" / "tiny.en")
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 1, 2])
    args = ap.parse_args()

    import jiwer
    from conftest import corpus_entries
    from test_batched import MODES, gapped_file, normalized, reference_text

    import whisperane

    model = whisperane.load_model(args.bundle, threads=2)
    texts = {e["id"]: e["text"] for e in corpus_entries()}
    references, hypotheses = [], {mode: [] for mode in MODES}
    print(f"load {loadavg()}\n\n| seed | seconds | " + " | ".join(f"{m} WER %" for m in MODES) + " | wall s |")
    print("|---|---|" + "---|" * len(MODES) + "---|")
    for seed in args.seeds:
        gapped = gapped_file(seed)
        references.append(reference_text(gapped, texts))
        start = time.perf_counter()
        for mode, options in MODES.items():
            hypotheses[mode].append(normalized(model.transcribe(gapped.audio, **options).text))
        wers = [100 * jiwer.wer(references[-1], hypotheses[m][-1]) for m in MODES]
        print(f"| {seed} | {len(gapped.audio) / 16000:.1f} | " + " | ".join(f"{w:.2f}" for w in wers)
              + f" | {time.perf_counter() - start:.0f} |", flush=True)
    pooled = {m: 100 * jiwer.wer(references, hypotheses[m]) for m in MODES}
    print("| pooled | | " + " | ".join(f"{pooled[m]:.2f}" for m in MODES) + " | |")
    for other in ("vad_filter", "guarded"):
        held = pooled["batched"] <= pooled[other] + BOUND_POINTS
        print(f"batched <= {other} + {BOUND_POINTS} points: {'met' if held else 'NOT MET'}")
    print(f"load {loadavg()}")


if __name__ == "__main__":
    main()
