"""Beam search, batched mode and two threads on one model: whisperane against faster-whisper (issues 13, 11, 10).

Prints markdown tables (see benchmarks/README.md, "Decoding benchmark"); every timed run is a whole process
(imports and model load included), 2 threads, word timestamps on, faster-whisper on the CTranslate2 directory
the whisperane bundle was converted from:

- beam: whisperane greedy and beam 5, faster-whisper int8 beam 5 (its default) and greedy, on JFK (median of
  ``--repeats``) and the >= 10-minute English file (median of ``--long-repeats``, once by default);
- batched: whisperane batched (``--batch-size 8``, Silero VAD) and sequential, faster-whisper int8 sequential and
  its ``BatchedInferencePipeline`` (batch 8), all greedy, on the long file and on the same file with 25 % silence
  and low noise inserted between clips (median of ``--long-repeats``, the engines interleaved run by run:
  faster-whisper's sequential wall moved by up to 45 % between two runs of one file); WER and the clips left
  without any word;
- threads: one loaded whisperane model (``threads=1``) transcribing the two halves of the long file one after the
  other and from two Python threads at once, in one child process: the wall-time ratio and whether the results
  are identical.

    python benchmarks/bench_decoding.py [--models tiny.en,base] [--only beam|batched|threads] [--quick]

The child processes it starts itself: ``run-fw`` (faster-whisper with a beam size, optionally batched) and
``run-threads``. Built audio goes to ``--cache`` (never the repository).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import (  # noqa: E402
    SAMPLE_RATE,
    Bench,
    Engine,
    LongFile,
    Run,
    Transcript,
    emit,
    loadavg,
    pct,
    progress,
    run_process,
    section,
    table,
    whisperane_engine,
)

SECTIONS = ("beam", "batched", "threads")
THIS = Path(__file__).resolve()
GAP_SHARE = 0.25  # share of the gapped file's duration that is inserted silence and noise
GAP_RANGE_S = (2.0, 10.0)  # length of one inserted gap
NOISE_RMS = 0.003  # "low noise": about -50 dBFS white noise
GAP_SEED = 11
FW_SEQUENTIAL = "faster-whisper int8"  # the peer the batched section's ratios and WER differences are taken to
BEAM_COLUMNS = ("model", "file", "engine", "wall s", "CPU s", "peak RSS MB", "WER %", "wall / fw beam 5",
                "CPU / fw beam 5")
BATCHED_COLUMNS = ("model", "file", "engine", "wall s", "CPU s", "peak RSS MB", "WER %", "clips without words",
                   "wall / fw seq", "CPU / fw seq")


# --- engines ------------------------------------------------------------------------------------------------------


def whisperane_with(bundle: Path, threads: int, label: str, extra: Sequence[str]) -> Engine:
    """The CLI (default compute type, word timestamps on) with extra options, under its own label."""
    base = whisperane_engine(bundle, threads)
    return Engine(label, lambda audio, out: [*base.command(audio, out), *extra])


def faster_whisper_with(model_dir: Path, threads: int, language: str | None, beam: int, batch: int, label: str
                        ) -> Engine:
    """faster-whisper int8 in a child process of this script: ``beam`` beams, sequential or batched (``batch`` > 0)."""

    def command(audio: Path, out: Path) -> list[str]:
        cmd = [sys.executable, str(THIS), "run-fw", str(audio), str(out / f"{audio.stem}.json"), "--model-path",
               str(model_dir), "--threads", str(threads), "--beam-size", str(beam), "--batch-size", str(batch)]
        return [*cmd, "--language", language] if language else cmd

    return Engine(label, command)


def run_faster_whisper(args: argparse.Namespace) -> int:
    """Child process: transcribe one file with faster-whisper int8 and write its segments and words as JSON."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(args.model_path, device="cpu", compute_type="int8", cpu_threads=args.threads)
    options = {"beam_size": args.beam_size, "word_timestamps": True, "language": args.language}
    if args.batch_size > 0:
        segments, info = BatchedInferencePipeline(model).transcribe(
            args.audio, batch_size=args.batch_size, **options
        )
    else:
        segments, info = model.transcribe(args.audio, **options)
    out = {"text": "", "language": info.language, "duration": info.duration, "segments": []}
    for s in segments:  # a generator: decoding happens while it is consumed
        words = [{"word": w.word, "start": w.start, "end": w.end} for w in s.words or []]
        out["segments"].append({"start": s.start, "end": s.end, "text": s.text, "words": words})
        out["text"] += s.text
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False), encoding="utf-8")
    return 0


def run_threads(args: argparse.Namespace) -> int:
    """Child process: one model (threads=1), the files one after the other, then all at once from one thread each.

    Writes each phase's wall and CPU seconds (this process's user + system) and whether the results' JSON are
    identical."""
    import resource
    from concurrent.futures import ThreadPoolExecutor

    import whisperane

    model = whisperane.load_model(args.model, threads=1)
    model.transcribe(args.warmup)  # first-call costs (session warm-up, VAD-free paths) out of both phases

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def one(path: str) -> str:
        return json.dumps(model.transcribe(path).to_dict(), sort_keys=True)

    phases: dict[str, dict] = {}
    for name in ("sequential", "threads"):
        w0, c0 = time.perf_counter(), cpu()
        if name == "sequential":
            results = [one(p) for p in args.audio]
        else:
            with ThreadPoolExecutor(max_workers=len(args.audio)) as pool:
                results = list(pool.map(one, args.audio))
        phases[name] = {"wall_s": time.perf_counter() - w0, "cpu_s": cpu() - c0, "results": results}
    report = {k: {"wall_s": v["wall_s"], "cpu_s": v["cpu_s"]} for k, v in phases.items()}
    report["identical"] = phases["sequential"]["results"] == phases["threads"]["results"]
    report["texts"] = [json.loads(r)["text"] for r in phases["sequential"]["results"]]
    Path(args.out).write_text(json.dumps(report, ensure_ascii=False), encoding="utf-8")
    return 0


# --- built audio ---------------------------------------------------------------------------------------------------


def gap_audio(rng: np.random.Generator, seconds: float, noise: bool) -> np.ndarray:
    n = int(round(seconds * SAMPLE_RATE))
    return (rng.standard_normal(n) * NOISE_RMS).astype(np.float32) if noise else np.zeros(n, dtype=np.float32)


def build_gapped_file(long: LongFile, cache: Path) -> LongFile:
    """The long file with gaps of 2-10 s, digital silence and low white noise in turn, inserted after randomly
    chosen clips until the inserted audio is ``GAP_SHARE`` of the result; cached next to it with the shifted spans.
    """
    import soundfile

    wav = cache / f"{long.path.stem}-gapped{int(GAP_SHARE * 100)}-seed{GAP_SEED}.wav"
    meta = wav.with_suffix(".json")
    if wav.is_file() and meta.is_file():
        m = json.loads(meta.read_text())
        return LongFile(wav, m["duration"], m["reference"], tuple(map(tuple, m["spans"])))
    audio, sr = soundfile.read(str(long.path), dtype="float32")
    assert sr == SAMPLE_RATE, long.path
    rng = np.random.default_rng(GAP_SEED)
    target = long.duration * GAP_SHARE / (1 - GAP_SHARE)  # inserted / (original + inserted) = GAP_SHARE
    lengths: list[float] = []
    while sum(lengths) < target - 1e-9:
        lengths.append(max(GAP_RANGE_S[0], min(float(rng.uniform(*GAP_RANGE_S)), target - sum(lengths))))
    after = set(rng.choice(len(long.spans), size=min(len(lengths), len(long.spans)), replace=False).tolist())
    pieces, spans, shift, cut, gaps = [], [], 0.0, 0, iter(lengths)
    for i, (start, end) in enumerate(long.spans):
        spans.append((start + shift, end + shift))
        if i in after:
            at = min(int(round(end * SAMPLE_RATE)), len(audio))  # right after the clip, before the 0.6 s gap
            noise = len(pieces) % 4 == 2  # every other inserted gap: pieces grow by two per gap
            pieces += [audio[cut:at], gap_audio(rng, next(gaps), noise)]
            cut, shift = at, shift + len(pieces[-1]) / SAMPLE_RATE
    pieces.append(audio[cut:])
    joined = np.concatenate(pieces)
    tmp = wav.with_suffix(".tmp.wav")
    soundfile.write(str(tmp), joined, SAMPLE_RATE, subtype="PCM_16")
    os.replace(tmp, wav)
    result = LongFile(wav, len(joined) / SAMPLE_RATE, long.reference, tuple(spans))
    meta.write_text(json.dumps({"duration": result.duration, "reference": result.reference, "spans": spans,
                                "inserted_s": shift}))
    return result


def split_halves(long: LongFile, cache: Path) -> list[Path]:
    """The long file cut in two at the clip boundary nearest its middle (two different files of equal size)."""
    import soundfile

    paths = [cache / f"{long.path.stem}-half{i}.wav" for i in (1, 2)]
    if all(p.is_file() for p in paths):
        return paths
    audio, _ = soundfile.read(str(long.path), dtype="float32")
    ends = np.asarray([e for _, e in long.spans])
    cut = int(round(ends[np.argmin(np.abs(ends - long.duration / 2))] * SAMPLE_RATE))
    for path, part in zip(paths, (audio[:cut], audio[cut:]), strict=True):
        tmp = path.with_suffix(".tmp.wav")
        soundfile.write(str(tmp), part, SAMPLE_RATE, subtype="PCM_16")
        os.replace(tmp, path)
    return paths


def clips_without_words(t: Transcript, spans: Sequence[tuple[float, float]]) -> int:
    """Clips of a built file with no word whose midpoint lies in the clip's span."""
    mids = np.asarray([(w[1] + w[2]) / 2 for w in t.words])
    return sum(1 for s, e in spans if not np.any((mids >= s) & (mids <= e)))


# --- the benchmark -------------------------------------------------------------------------------------------------


def summary(runs: list[Run]) -> tuple[float, float, float]:
    """(median wall, median CPU, max peak RSS MB)."""
    return (statistics.median(r.wall for r in runs), statistics.median(r.cpu for r in runs),
            max(r.peak_rss_mb for r in runs))


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else ""


class DecodingBench(Bench):
    def files(self) -> tuple[tuple[str, Path, float, str, int], ...]:
        """(name, path, duration, reference, repeats) of JFK and the long file."""
        jfk, long = self.jfk(), self.long_file(self.args.long_minutes)
        return (("jfk", jfk.path, jfk.duration, jfk.text, self.args.repeats),
                ("long", long.path, long.duration, long.reference, self.args.long_repeats))

    def wer(self, engine: Engine, tag: str, audio: Path, reference: str) -> tuple[str, Transcript | None]:
        t = self.output_of(engine, tag, audio)
        return (pct(*self.scorer.errors(reference, t.text, "en")) if t else "-"), t

    def rows_of(self, model: str, name: str, engines: Sequence[Engine], runs: dict[str, list[Run]], peer: str
                ) -> tuple[list[list[object]], dict[str, tuple[float, float, float]]]:
        """Table rows (model, file, engine, wall, CPU, RSS, wall and CPU ratio to ``peer``) and the summaries."""
        ok = {k: summary(v) for k, v in runs.items() if v and all(r.returncode == 0 for r in v)}
        rows = []
        for e in engines:
            if e.label not in ok:
                tail = runs[e.label][-1].stderr_tail if runs.get(e.label) else ""
                rows.append([model, name, e.label, "failed", "", "", "", "", tail[:120]])
                continue
            wall, cpu, rss = ok[e.label]
            peer_wall, peer_cpu, _ = ok.get(peer, (None, None, None))
            rows.append([model, name, e.label, f"{wall:.2f}", f"{cpu:.2f}", f"{rss:.0f}", ratio(wall, peer_wall),
                         ratio(cpu, peer_cpu)])
        return rows, ok

    def beam(self) -> None:
        section("Beam search: whisperane beam 5 against faster-whisper int8 beam 5 (issue 13)")
        t = self.args.threads
        for model in self.models:
            lang, bundle, ct2 = self.fixed_language(model), self.bundle(model), self.ct2_dir(model)
            engines = [whisperane_engine(bundle, t), whisperane_with(bundle, t, "whisperane beam 5", ["--beam-size", "5"]),
                       faster_whisper_with(ct2, t, lang, 5, 0, "faster-whisper int8 beam 5"),
                       faster_whisper_with(ct2, t, lang, 1, 0, "faster-whisper int8 greedy")]
            for name, path, duration, reference, repeats in self.files():
                tag = f"beam-{model}-{name}"
                runs = self.measure(engines, path, repeats, tag)
                table_rows, ok = self.rows_of(model, f"{name} ({duration:.0f} s)", engines, runs,
                                              "faster-whisper int8 beam 5")
                for row, e in zip(table_rows, engines, strict=True):
                    row.insert(6, self.wer(e, tag, path, reference)[0])
                # one table per model and file, so that a run cut short keeps what it measured
                emit(table(BEAM_COLUMNS, table_rows) + "\n")
                greedy, beam = ok.get("whisperane"), ok.get("whisperane beam 5")
                if greedy and beam:
                    emit(f"whisperane beam 5 / greedy ({model}, {name}; goal on the long file: <= 1.5x): wall "
                         f"**{ratio(beam[0], greedy[0])}x**, CPU {ratio(beam[1], greedy[1])}x\n")
                progress(f"{tag} done; load average {loadavg()}")

    def batched(self) -> None:
        section("Batched mode: whisperane --batch-size 8 against faster-whisper int8 (issue 11)")
        long = self.long_file(self.args.long_minutes)
        gapped = build_gapped_file(long, self.cache)
        emit(f"Files: the long file ({long.duration:.0f} s, {len(long.spans)} clips) and the same file with "
             f"{gapped.duration - long.duration:.0f} s of 2-10 s gaps (digital silence and white noise at RMS "
             f"{NOISE_RMS}, in turn) inserted after randomly chosen clips ({gapped.duration:.0f} s, "
             f"{100 * (gapped.duration - long.duration) / gapped.duration:.0f} % inserted). All engines greedy "
             f"(beam 1, the default temperature fallback).\n")
        for model in self.models:
            engines = self.batched_engines(model)
            for name, built in (("long", long), ("gapped", gapped)):
                tag = f"batched-{model}-{name}"
                runs = self.measure(engines, built.path, self.args.long_repeats, tag)
                table_rows, _ = self.rows_of(model, f"{name} ({built.duration:.0f} s)", engines, runs,
                                             FW_SEQUENTIAL)
                for row, e in zip(table_rows, engines, strict=True):
                    wer, transcript = self.wer(e, tag, built.path, built.reference)
                    empty = (
                        f"{clips_without_words(transcript, built.spans)}/{len(built.spans)}"
                        if transcript
                        else "-"
                    )
                    row[6:6] = [wer, empty]
                emit(table(BATCHED_COLUMNS, table_rows) + "\n")
                progress(f"{tag} done; load average {loadavg()}")
            if self.args.wer_orders > 1:
                self.pooled_wer(model, engines, long_tag=f"batched-{model}-long")

    def batched_engines(self, model: str) -> list[Engine]:
        t, lang, bundle, ct2 = self.args.threads, self.fixed_language(model), self.bundle(model), self.ct2_dir(model)
        return [whisperane_with(bundle, t, "whisperane batched 8", ["--batch-size", "8"]),
                whisperane_engine(bundle, t),
                faster_whisper_with(ct2, t, lang, 1, 0, FW_SEQUENTIAL),
                faster_whisper_with(ct2, t, lang, 1, 8, "faster-whisper int8 batched 8")]

    def pooled_wer(self, model: str, engines: Sequence[Engine], long_tag: str) -> None:
        """Every engine once on ``--wer-orders`` long files, the same clips in rotated orders (rotation 0 is the
        long file, whose transcripts from the runs tagged ``long_tag`` are reused): each order's WER and the WER of all their words together.
        One 10-minute file holds ~1,500 words, and which clips follow which moves a WER by more than the
        half-point bound (tiny.en, 2026-12-04: faster-whisper int8 sequential 3.81 to 6.79 % over four orders,
        whisperane batched 3.85 to 5.65 %)."""
        n = len(self.english)
        rotations = sorted({round(k * n / self.args.wer_orders) % n for k in range(self.args.wer_orders)})
        errors: dict[str, list[tuple[int, int] | None]] = {e.label: [] for e in engines}
        empty, clips = dict.fromkeys(errors, 0), 0
        for rotate in rotations:
            built, tag = self.long_file(self.args.long_minutes, rotate), long_tag
            if rotate:
                tag = f"orders-{model}-{rotate}"
                self.measure(engines, built.path, 1, tag)
                progress(f"{tag} done; load average {loadavg()}")
            clips += len(built.spans)
            for e in engines:
                t = self.output_of(e, tag, built.path)
                errors[e.label].append(self.scorer.errors(built.reference, t.text, "en") if t else None)
                empty[e.label] += clips_without_words(t, built.spans) if t else 0
        pooled = {k: 100 * sum(x[0] for x in v) / sum(x[1] for x in v) if all(v) else None for k, v in errors.items()}
        peer = pooled[FW_SEQUENTIAL]
        rows = [[model, label, *(pct(*x) if x else "-" for x in v),
                 "-" if pooled[label] is None else f"{pooled[label]:.2f}",
                 "" if pooled[label] is None or peer is None else f"{pooled[label] - peer:+.2f}",
                 f"{empty[label]}/{clips}"] for label, v in errors.items()]
        emit(f"WER over {len(rotations)} orders of the long file's clips (rotations {', '.join(map(str, rotations))} "
             f"of the {n} English clips), each engine once per order:\n")
        emit(table(("model", "engine", *(f"WER % order {r}" for r in rotations), "pooled WER %",
                    "pooled - fw seq, points", "clips without words"), rows) + "\n")

    def threads(self) -> None:
        section("Two threads on one loaded model (issue 10)")
        long = self.long_file(self.args.long_minutes)
        halves = split_halves(long, self.cache)
        rows = []
        for model in self.models[:1]:
            out = self.work / f"threads-{model}.json"
            cmd = [sys.executable, str(THIS), "run-threads", str(out), "--model", str(self.bundle(model)),
                   "--warmup", str(self.jfk().path), *map(str, halves)]
            run = run_process(cmd)
            if run.returncode != 0 or not out.is_file():
                rows.append([model, "failed", "", "", "", "", run.stderr_tail[:120]])
                continue
            r = json.loads(out.read_text(encoding="utf-8"))
            seq, par = r["sequential"], r["threads"]
            rows.append([model, f"{seq['wall_s']:.1f}", f"{par['wall_s']:.1f}", f"**{par['wall_s'] / seq['wall_s']:.2f}**",
                         f"{seq['cpu_s']:.1f}", f"{par['cpu_s']:.1f}", "yes" if r["identical"] else "**no**"])
            progress(f"threads {model}: {rows[-1]}")
        emit(f"Two files, the halves of the long file ({long.duration / 2 / 60:.1f} min each), one model loaded with "
             "threads=1 in one process (after a warm-up call on JFK): one after the other, then from two Python "
             "threads at once. CPU s: the process's user + system time in each phase. Identical: every result's "
             "JSON (text, segments, words) equal between the phases.\n")
        emit(table(["model", "sequential wall s", "2 threads wall s", "ratio (goal <= 0.6)", "sequential CPU s",
                    "2 threads CPU s", "identical"], rows))


def header(args: argparse.Namespace) -> None:
    cpu = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), cpu)
    except OSError:
        pass

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    emit("# whisperane decoding benchmark: beam search, batched mode, threads\n")
    emit(f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    emit(f"- CPU: {cpu}; {os.cpu_count()} cores; load average {loadavg()}")
    emit(f"- Python {platform.python_version()} on {platform.platform()}")
    emit("- versions: " + ", ".join(f"{p} {version(p)}" for p in ("whisperane", "onnxruntime", "faster-whisper",
                                                                   "ctranslate2", "numpy")))
    emit(
        f"- settings: models {args.models}; {args.threads} threads; word timestamps on; JFK runs: median of "
        f"{args.repeats}; long files ({args.long_minutes:g} min): median of {args.long_repeats}; "
        f"{'quick' if args.quick else 'full'} run"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--models",
        default=None,
        help="comma-separated model names (default: tiny.en,base; tiny.en with --quick)",
    )
    p.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared" / "corpus"),
                   help="directory holding manifest.jsonl")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for every engine")
    p.add_argument("--repeats", type=int, default=3, help="runs per engine on JFK (median reported)")
    p.add_argument("--long-repeats", type=int, default=1, help="runs per engine on the long files (median reported)")
    p.add_argument(
        "--long-minutes",
        type=float,
        default=None,
        help="length of the long English file (default 10; 3 with --quick)",
    )
    p.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "whisperane", "bench"),
                   help="where built audio files are kept")
    p.add_argument("--wer-orders", type=int, default=4,
                   help="batched: long files of the clips in this many orders for a pooled WER (1: the long file only)")
    p.add_argument("--quick", action="store_true", help="tiny.en, JFK and a 3-minute file")
    p.add_argument("--only", choices=SECTIONS, action="append", help="run only this section (repeatable)")
    args = p.parse_args(argv)
    args.models = args.models or ("tiny.en" if args.quick else "tiny.en,base")
    args.long_minutes = args.long_minutes or (3.0 if args.quick else 10.0)
    if not (Path(args.corpus) / "manifest.jsonl").is_file():
        p.error(f"{args.corpus}: no manifest.jsonl (pass --corpus)")
    if min(args.threads, args.repeats, args.long_repeats, args.wer_orders) < 1 or args.long_minutes <= 0:
        p.error("--threads, --repeats, --long-repeats and --wer-orders must be >= 1 and --long-minutes > 0")
    return args


def child(argv: list[str]) -> int:
    """The child processes: ``run-fw`` and ``run-threads``."""
    p = argparse.ArgumentParser(prog="bench_decoding.py")
    sub = p.add_subparsers(dest="command", required=True)
    fw = sub.add_parser("run-fw")
    fw.add_argument("audio")
    fw.add_argument("out")
    fw.add_argument("--model-path", required=True)
    fw.add_argument("--threads", type=int, default=2)
    fw.add_argument("--beam-size", type=int, default=5)
    fw.add_argument("--batch-size", type=int, default=0, help="> 0: BatchedInferencePipeline")
    fw.add_argument("--language", default=None)
    th = sub.add_parser("run-threads")
    th.add_argument("out")
    th.add_argument("audio", nargs="+")
    th.add_argument("--model", required=True)
    th.add_argument("--warmup", required=True)
    args = p.parse_args(argv)
    return run_faster_whisper(args) if args.command == "run-fw" else run_threads(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["run-fw"], ["run-threads"]):
        return child(argv)
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the work directory is removed
    t0 = time.perf_counter()
    header(args)
    bench = DecodingBench(args)
    try:
        for name in SECTIONS:
            if not args.only or name in args.only:
                getattr(bench, name)()
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    emit(f"\n_finished in {(time.perf_counter() - t0) / 60:.1f} min; load average at end: {loadavg()}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
