"""Byte-identical outputs across a refactoring, from two checkouts: what ``whisperane transcribe`` writes for every
corpus clip and one long file under six decoding configurations, the events of ``whisperane stream`` on a fixed
chunk schedule, and the bodies ``whisperane serve`` answers.

    python benchmarks/check_identical.py run --root /path/to/old/checkout --out /tmp/ref --long /tmp/long-en.wav
    python benchmarks/check_identical.py run --root . --out /tmp/new --long /tmp/long-en.wav
    python benchmarks/check_identical.py compare /tmp/ref /tmp/new

``run`` runs the code of the checkout at ``--root`` (``PYTHONPATH`` pointing at it, its ``models/`` holding the
bundles) and writes:

- ``OUT/<config>/<clip id>.{json,txt,srt,vtt,tsv}``: ``transcribe --output-format all`` over all inputs at once.
  The inputs are the clips of ``--corpus`` (``manifest.jsonl``; ``tests/data`` when there is none) and a long
  English file built once by concatenating the corpus's English clips with short pauses (``--long``, reused when
  it exists, so that both runs read the same samples: give both runs the same path).
- ``OUT/stream-<model>/<id>.jsonl``: ``stream FILE --format jsonl`` without ``--realtime``: the file is read in
  chunks of exactly ``--min-chunk`` seconds and each chunk is fed as soon as the last update ends, so the updates
  fall on the same samples whatever the machine's speed. Only ``wall_time`` (the stream's clock) is removed from
  each event; every time on the audio stays.
- ``OUT/server-tiny.en/<id>.{json,txt,srt}``: ``serve`` on 127.0.0.1 (a free port), one decode at a time on one
  thread, answering POST /v1/audio/transcriptions as verbose_json (word and segment timestamps), text and srt.

Every run uses ``--threads`` ONNX Runtime threads (1 by default): keep it the same in both runs, int8 kernels may
sum in another order with another thread count.
``compare`` lists every output that differs (where it first does) or exists on one side only, prints a count
per part, and exits non-zero if any differs or a side has none. ``--only PART`` (repeatable) restricts ``run``
and ``compare`` to some parts: the configurations, ``stream-tiny.en``, ``stream-base``, ``server-tiny.en``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
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
    # The spelling the README gives; the parser also takes ``--speech-guard False`` (the same option).
    "tiny.en-no-guard": ["--model", "tiny.en", "--no-speech-guard"],
    "base-sequential": ["--model", "base"],
}
PAUSES_S = (0.4, 0.9, 0.6, 1.2)  # cycled between clips: short pauses, some shorter than a VAD gap
# JFK (the corpus's copy is the same file as tests/data/jfk.flac), two LibriSpeech clips, the long file: short
# utterances, a pause-closed sentence, and a stream whose buffer is trimmed many times.
STREAM_INPUTS = {
    "tiny.en": ("jfk", "librispeech-test-clean-1089-134686-0000", "librispeech-dev-clean-2412-153948-0000",
                "long-en"),
    # Without the long file: base decodes each update's buffer several times slower than tiny.en, and its long
    # stream would cost more than the rest of the check. The German clip makes base detect the stream's language.
    "base": ("jfk", "librispeech-test-clean-1089-134686-0000", "picovoice-de"),
}
# Pinned rather than left to the default: the updates fall on the same samples in both checkouts.
STREAM_FLAGS = ["--format", "jsonl", "--min-chunk", "0.5"]
WALL_CLOCK_FIELDS = ("wall_time",)  # seconds on the stream's clock when the event was emitted
SERVER_MODEL = "tiny.en"
SERVER_INPUTS = STREAM_INPUTS["tiny.en"]
SERVER_FORMATS = {"verbose_json": "json", "text": "txt", "srt": "srt"}
# One decode at a time, so that the encoder and the decoder run on --threads each, as in ``transcribe``. The
# decode timeout is raised so that a slow, shared machine never turns a request into a 400.
SERVER_FLAGS = ["--max-concurrency", "1", "--decode-timeout", "3600"]
SERVER_START_S = 180.0
COMPARED = (".json", ".jsonl", ".txt", ".srt", ".vtt", ".tsv")


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


def link_inputs(args: argparse.Namespace, root: Path) -> dict[str, Path]:
    """OUT/inputs/<id>.<ext> -> the audio, for every clip and the long file; id -> link."""
    clips = corpus_clips(Path(args.corpus))
    long_path = Path(args.long)
    if not long_path.is_file():
        build_long_file(clips, long_path, root)
    inputs = Path(args.out) / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    links = {}
    for clip_id, (audio, _) in [*clips.items(), ("long-en", (long_path.resolve(), "en"))]:
        link = inputs / f"{clip_id}{audio.suffix}"
        if not link.exists():
            link.symlink_to(audio.resolve())
        links[clip_id] = link
    return links


def run_transcribe(flags: list[str], files: list[Path], out: Path, root: Path, env: dict) -> str | None:
    cmd = [sys.executable, "-m", "whisperane", "transcribe", *map(str, files), "--output-dir", str(out),
           "--output-format", "all", "--overwrite", *flags]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
    return f"exit {proc.returncode}: {proc.stderr[-2000:]}" if proc.returncode else None


def strip_wall_clock(line: str) -> str:
    event = json.loads(line)
    for key in WALL_CLOCK_FIELDS:
        event.pop(key, None)
    return json.dumps(event, ensure_ascii=False)


def run_stream(model: str, flags: list[str], inputs: dict[str, Path], out: Path, root: Path, env: dict) -> str | None:
    """One ``stream`` process per input; its events, without wall-clock fields, to OUT/stream-<model>/<id>.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    for clip_id in STREAM_INPUTS[model]:
        cmd = [sys.executable, "-m", "whisperane", "stream", str(inputs[clip_id]), "--model", model, *flags]
        proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
        if proc.returncode:
            return f"{clip_id}: exit {proc.returncode}: {proc.stderr[-2000:]}"
        lines = [strip_wall_clock(line) for line in proc.stdout.splitlines() if line.strip()]
        if not lines or json.loads(lines[-1])["type"] != "done":
            return f"{clip_id}: the stream did not end with a 'done' event"
        (out / f"{clip_id}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str) -> str | None:
    import requests

    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited with {proc.returncode} before it was up"
        try:
            if requests.get(url + "/health", timeout=5).json().get("status") == "ok":
                return None
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.5)
    return f"no healthy /health within {SERVER_START_S:.0f} s"


def post_all(url: str, inputs: dict[str, Path], out: Path) -> str | None:
    """Each input in each response format, one request at a time; the body to OUT/server-<model>/<id>.<ext>."""
    import requests

    out.mkdir(parents=True, exist_ok=True)
    for clip_id in SERVER_INPUTS:
        for fmt, ext in SERVER_FORMATS.items():
            form = [("model", SERVER_MODEL), ("response_format", fmt)]
            if fmt == "verbose_json":
                form += [("timestamp_granularities[]", "word"), ("timestamp_granularities[]", "segment")]
            with open(inputs[clip_id], "rb") as f:
                r = requests.post(url + "/v1/audio/transcriptions", data=form,
                                  files={"file": (inputs[clip_id].name, f)}, timeout=1800)
            if r.status_code != 200:
                return f"{clip_id} {fmt}: HTTP {r.status_code}: {r.text[:500]}"
            (out / f"{clip_id}.{ext}").write_bytes(r.content)
    return None


def run_server(flags: list[str], out: Path, inputs: dict[str, Path], root: Path, env: dict, log: Path) -> str | None:
    """``serve`` started, asked, and stopped with SIGTERM (it drains and exits 0)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "whisperane", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", SERVER_MODEL, *flags]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            failure = wait_healthy(proc, url) or post_all(url, inputs, out)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    if failure is None and code != 0:
        failure = f"the server exited with {code} on SIGTERM"
    return f"{failure} (log: {log})" if failure else None


def parts(args: argparse.Namespace, inputs: dict[str, Path], root: Path, env: dict) -> dict:
    """Part name -> a function that runs it and returns a failure or None."""
    out, threads = Path(args.out), str(args.threads)
    files = sorted(inputs.values())
    table = {name: (lambda n=name, f=flags: run_transcribe([*f, "--threads", threads], files, out / n, root, env))
             for name, flags in CONFIGS.items()}
    stream_flags = [*STREAM_FLAGS, "--threads", threads]
    for model in STREAM_INPUTS:
        table[f"stream-{model}"] = lambda m=model: run_stream(m, stream_flags, inputs, out / f"stream-{m}", root, env)
    name = f"server-{SERVER_MODEL}"
    server_flags = [*SERVER_FLAGS, "--threads-per-worker", threads, "--encoder-threads", threads]
    table[name] = lambda: run_server(server_flags, out / name, inputs, root, env, out / "logs" / f"{name}.log")
    return table


def part_names() -> list[str]:
    return [*CONFIGS, *(f"stream-{m}" for m in STREAM_INPUTS), f"server-{SERVER_MODEL}"]


def run(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    inputs = link_inputs(args, root)
    env = {**os.environ, "PYTHONPATH": str(root)}
    for name, fn in parts(args, inputs, root, env).items():
        if args.only and name not in args.only:
            continue
        for stale in (Path(args.out) / name).glob("*"):  # an earlier run's outputs would pass for this one's
            if stale.suffix in COMPARED:
                stale.unlink()
        t0 = time.monotonic()
        failure = fn()
        count = sum(1 for p in (Path(args.out) / name).glob("*") if p.suffix in COMPARED)
        print(f"{name}: {'FAILED' if failure else 'ok'}, {count} files, {time.monotonic() - t0:.0f} s", flush=True)
        if failure:
            print(failure, file=sys.stderr)
            return 1
    return 0


def outputs(tree: Path) -> set[Path]:
    """The compared files under ``tree`` (the inputs' links and the logs are not outputs)."""
    return {p.relative_to(tree) for p in tree.glob("*/*") if p.suffix in COMPARED and p.parent.name != "inputs"}


def first_difference(a: Path, b: Path) -> str:
    """Where two files first differ: the line, the column, and the text around it on each side."""
    la, lb = a.read_bytes().split(b"\n"), b.read_bytes().split(b"\n")
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            col = next((j for j, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            lo = max(0, col - 60)
            return (f"line {i + 1}, column {col + 1}:\n    A: {x[lo:col + 60].decode(errors='replace')}"
                    f"\n    B: {y[lo:col + 60].decode(errors='replace')}")
    return f"{len(la)} lines against {len(lb)}"


def compare(args: argparse.Namespace) -> int:
    a, b = Path(args.a), Path(args.b)
    names = sorted(n for n in outputs(a) | outputs(b) if not args.only or n.parts[0] in args.only)
    per_part: dict[str, list[int]] = {}
    for name in names:
        count = per_part.setdefault(name.parts[0], [0, 0])
        count[0] += 1
        part_a, part_b = (a / name.parts[0]).is_dir(), (b / name.parts[0]).is_dir()
        if part_a != part_b:
            continue  # a part run on one side only: told once, below, not file by file
        if not (a / name).is_file() or not (b / name).is_file():
            print(f"{name}: only in {a if (a / name).is_file() else b}")
        elif (a / name).read_bytes() != (b / name).read_bytes():
            print(f"{name}: differs at {first_difference(a / name, b / name)}")
        else:
            count[1] += 1
    for part, (n, same) in per_part.items():
        alone = a if not (b / part).is_dir() else b if not (a / part).is_dir() else None
        note = f", only in {alone} (pass --only to leave it out)" if alone else f", {n - same} NOT" if n != same else ""
        print(f"  {part:<24} {n:4d} files, {same:4d} identical{note}")
    bad = len(names) - sum(same for _, same in per_part.values())
    print(f"{len(names)} files compared, {len(names) - bad} identical, {bad} not")
    return 1 if bad or not names else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--root", default=str(REPO), help="checkout whose code runs (its models/ holds the bundles)")
    r.add_argument("--out", required=True)
    r.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    r.add_argument("--long", default=str(Path.home() / ".cache" / "whisperane" / "check_identical" / "long-en.wav"))
    r.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads of every run (keep it the same)")
    r.add_argument("--only", action="append", choices=part_names(), help="run only these parts (repeatable)")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--only", action="append", choices=part_names(), help="compare only these parts (repeatable)")
    args = p.parse_args()
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
