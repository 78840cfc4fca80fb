"""What a live update costs, variant against variant (issue 41): each variant streams the same file chunked
(one update per ``min_chunk`` of audio, no clock: the updates are the same every run), in interleaved rounds;
per variant the CPU seconds of the process (all threads), the wall seconds, and whether the
confirmed text is the baseline's. CPU time is what a variant saves; it is also less disturbed than wall time
by other work on a shared machine (the load average is printed).

    PYTHONPATH=$PWD python benchmarks/bench_stream_cost.py --variants '{}' '{"alignment": "decode"}'
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=60.0, help="of the bench_stream file")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=["{}", '{"alignment": "decode"}'], help="stream options, JSON")
    args = p.parse_args()

    from bench_stream import build_file

    import whisperane

    path, _, seconds = build_file(Path("/tmp/whisperane-bench-stream"), args.seconds)
    bundle = REPO / "models" / args.model
    model = whisperane.load_model(bundle if bundle.is_dir() else args.model, threads=args.threads)
    variants = [json.loads(v) for v in args.variants]
    list(whisperane.stream(np.zeros((4, 8000), np.float32) + 0.01, model))  # warm-up
    cpu: dict[int, list[float]] = {i: [] for i in range(len(variants))}
    wall: dict[int, list[float]] = {i: [] for i in range(len(variants))}
    texts: dict[int, str] = {}
    print(f"{path.name}: {seconds:.1f} s, {args.model}, threads {args.threads}; load {Path('/proc/loadavg').read_text().split()[0]}")
    for _ in range(args.rounds):
        for i, options in enumerate(variants):
            c, t = _cpu(), time.perf_counter()
            stream = whisperane.LiveTranscriber(model, **options)
            for chunk in _chunks(path, stream.live.min_chunk):
                stream.feed(chunk)
            events = stream.finish()
            wall[i].append(time.perf_counter() - t)
            cpu[i].append(_cpu() - c)
            texts[i] = events[-1].text
    print(f"load after: {Path('/proc/loadavg').read_text().split()[0]}")
    print("| variant | CPU s (median, spread) | wall s (median) | CPU vs first | text = first's |\n|---|---|---|---|---|")
    base = float(np.median(cpu[0]))
    for i, options in enumerate(variants):
        m = float(np.median(cpu[i]))
        print(f"| {json.dumps(options)} | {m:.2f} ({min(cpu[i]):.2f}-{max(cpu[i]):.2f}) | {float(np.median(wall[i])):.2f} | "
              f"{100 * (m / base - 1):+.1f} % | {texts[i] == texts[0]} |")
    for i in range(1, len(variants)):
        if texts[i] != texts[0]:
            print(f"first: {texts[0]}\nvariant {i}: {texts[i]}")


def _chunks(path: Path, chunk_s: float):
    from whisperane.live.chunks import file_chunks

    return file_chunks(path, chunk_s)


if __name__ == "__main__":
    main()
