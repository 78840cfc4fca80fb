"""Child processes of the benchmark, each timed from the outside as a user would see it (imports and model load
included).

    python benchmarks/runners.py faster-whisper AUDIO OUT.json --model-path DIR --compute-type int8 --threads 2
    python benchmarks/runners.py whisperane-threads OUT.json --model M --threads 2 --workers 4 AUDIO [AUDIO ...]
    python benchmarks/runners.py measure OUT.json -- COMMAND [ARG ...]

``faster-whisper`` transcribes one file with the settings whisperane is compared under (greedy, beam 1, default
temperature fallback, word timestamps on unless ``--no-word-timestamps``) and writes the segments and words as JSON.
``whisperane-threads`` loads one model and transcribes the files from ``--workers`` threads sharing it (1 worker:
one after the other), writing each file's text and its wall time. ``measure`` runs a command and writes its wall
time, CPU time (user + system) and peak RSS (``ru_maxrss`` from ``wait4``); being a small fresh process, its own
RSS at fork does not inflate the child's ``ru_maxrss`` as a large parent's would.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for a server a benchmark starts."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(proc, url: str, seconds: float = 180.0) -> bool:
    """Whether the server process ``proc`` answers ``url``/health within ``seconds`` (False once it has exited)."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            time.sleep(0.2)
    return False


def run_faster_whisper(args: argparse.Namespace) -> int:
    from faster_whisper import WhisperModel

    model = WhisperModel(args.model_path, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads)
    segments, info = model.transcribe(args.audio, beam_size=1, word_timestamps=args.word_timestamps,
                                      language=args.language or None)
    out = {"text": "", "language": info.language, "duration": info.duration, "segments": []}
    for s in segments:  # a generator: decoding happens while it is consumed
        words = [{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability} for w in s.words or []]
        out["segments"].append({"start": s.start, "end": s.end, "text": s.text, "words": words})
        out["text"] += s.text
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    return 0


def run_whisperane_threads(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from whisperane import load_model
    from whisperane.transcribe import transcribe

    model = load_model(args.model, threads=args.threads)
    t0 = time.perf_counter()

    def one(path: str) -> str:
        return transcribe(path, model, language=args.language or None).text

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        texts = list(pool.map(one, args.audio))
    wall = time.perf_counter() - t0
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "transcribe_wall_s": wall}, f, ensure_ascii=False)
    return 0


def run_measure(args: argparse.Namespace) -> int:
    import os
    import subprocess

    t0 = time.perf_counter()
    p = subprocess.Popen(args.cmd)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    report = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_kb": usage.ru_maxrss,
              "returncode": p.returncode}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fw = sub.add_parser("faster-whisper")
    fw.add_argument("audio")
    fw.add_argument("out")
    fw.add_argument("--model-path", required=True, help="CTranslate2 model directory")
    fw.add_argument("--compute-type", default="int8")
    fw.add_argument("--threads", type=int, default=2)
    fw.add_argument("--language", default=None)
    fw.add_argument("--no-word-timestamps", dest="word_timestamps", action="store_false")
    th = sub.add_parser("whisperane-threads")
    th.add_argument("out")
    th.add_argument("audio", nargs="+")
    th.add_argument("--model", required=True)
    th.add_argument("--threads", type=int, default=2)
    th.add_argument("--workers", type=int, default=4)
    th.add_argument("--language", default=None)
    me = sub.add_parser("measure")
    me.add_argument("out")
    me.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    if args.command == "measure":
        args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return run_measure(args)
    if args.command == "faster-whisper":
        return run_faster_whisper(args)
    return run_whisperane_threads(args)


if __name__ == "__main__":
    sys.exit(main())
