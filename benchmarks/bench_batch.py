"""``whisperane batch`` throughput on Ray Data against a plain loop over ``transcribe()``.

Every measurement is a whole process (imports, Ray start, model loads included), on the speech corpus
(/work/shared/corpus, English clips by default; tests/data when it is absent):

- Ray's fixed start-up cost: ``ray.init()`` of a local Ray and its shutdown, in a fresh process; and
  ``whisperane batch`` on one short clip against a plain process transcribing that clip;
- throughput (audio seconds per wall second) of ``whisperane batch`` with 1 and 2 workers x 1 thread and of one
  process looping over ``transcribe()`` with one model on 2 threads; the rows' texts are checked equal to
  the loop's.

Prints a markdown report (``--out FILE`` writes it too). Outputs go to a temporary directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"

RAY_START = """
import time; t0 = time.perf_counter()
import ray; t1 = time.perf_counter()
ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False); t2 = time.perf_counter()
ray.shutdown(); t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""

LOOP = """
import json, sys, whisperane
model = whisperane.load_model(sys.argv[1], threads=int(sys.argv[2]))
texts = {p: whisperane.transcribe(p, model=model).text for p in sys.argv[3:]}
print(json.dumps(texts))
"""


def corpus_clips(languages: set[str] | None) -> list[tuple[str, float]]:
    """(path, seconds) of the corpus clips in ``languages`` (all when None)."""
    manifest = CORPUS / "manifest.jsonl"
    if not manifest.is_file():
        import soundfile

        return [(str(p), soundfile.info(str(p)).duration) for p in sorted((REPO / "tests" / "data").glob("*.flac"))]
    entries = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(str(CORPUS / e["audio"]), float(e["duration_s"])) for e in entries
            if languages is None or e["language"] in languages]


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    return time.perf_counter() - t0, done


def run_batch(paths: list[str], model: str, workers: int, threads: int, work: Path) -> tuple[float, dict[str, str]]:
    """Wall seconds of ``whisperane batch`` over ``paths`` (a JSONL manifest) and the texts of its rows."""
    out = work / f"out-{workers}x{threads}-{len(paths)}"
    manifest = work / f"manifest-{len(paths)}.jsonl"
    manifest.write_text("".join(json.dumps({"path": p}) + "\n" for p in paths))
    wall, done = timed([sys.executable, "-m", "whisperane.ray_batch", str(manifest), "--output", str(out), "--model", model,
                        "--workers", str(workers), "--threads-per-worker", str(threads)])
    if done.returncode != 0:
        raise SystemExit(f"whisperane batch failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = [json.loads(line) for shard in sorted(out.glob("part-*.jsonl")) for line in shard.open()]
    return wall, {r["path"]: r["text"] for r in rows}


def run_loop(paths: list[str], model: str, threads: int) -> tuple[float, dict[str, str]]:
    wall, done = timed([sys.executable, "-c", LOOP, model, str(threads), *paths])
    if done.returncode != 0:
        raise SystemExit(f"the transcribe() loop failed: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


def ray_start_cost() -> tuple[float, float, float]:
    """(import, init, shutdown) seconds of a local Ray in a fresh process."""
    _, done = timed([sys.executable, "-c", RAY_START])
    return tuple(float(x) for x in done.stdout.split())


def report(args: argparse.Namespace) -> str:
    clips = corpus_clips(None if args.languages == "all" else set(args.languages.split(",")))
    paths, audio_s = [p for p, _ in clips], sum(d for _, d in clips)
    short = min(clips, key=lambda c: c[1])[0]
    lines = [
        "# whisperane batch (Ray Data) benchmark", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load average at start "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"- model {args.model}; {len(paths)} clips, {audio_s:.1f} s of audio ({args.languages}); whole processes",
        "",
    ]
    imp, init, shut = ray_start_cost()
    lines += ["## Ray's fixed cost", "", f"- `import ray` {imp:.1f} s, local `ray.init()` {init:.1f} s, "
              f"`ray.shutdown()` {shut:.1f} s"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one_batch, _ = run_batch([short], args.model, 1, 1, work)
        one_loop, _ = run_loop([short], args.model, 1)
        lines += [f"- one {Path(short).name} clip: `whisperane batch` {one_batch:.1f} s, a plain process "
                  f"{one_loop:.1f} s: **{one_batch - one_loop:.1f} s** of fixed cost", "",
                  "## Throughput", "", "| runner | wall s | audio s / wall s | texts as the loop's |", "|---|---|---|---|"]
        loop_wall, loop_texts = run_loop(paths, args.model, 2)
        lines.append(f"| plain loop over transcribe(), 1 model x 2 threads | {loop_wall:.1f} | {audio_s / loop_wall:.2f} | - |")
        for workers in (1, 2):
            wall, texts = run_batch(paths, args.model, workers, 1, work)
            same = sum(texts.get(p) == loop_texts[p] for p in paths)
            lines.append(f"| whisperane batch, {workers} worker(s) x 1 thread | {wall:.1f} | {audio_s / wall:.2f} | "
                         f"{same}/{len(paths)} |")
    lines += ["", f"_load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}_", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny.en", help="model name or bundle directory")
    parser.add_argument("--languages", default="en", help="corpus languages, comma-separated, or 'all'")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    text = report(args)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
